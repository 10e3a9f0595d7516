"""Warm rows (a prefix cache across requests, peers/conversation/warm_rows.py) through the real `openai` client
against a real `sfchat serve` with two peer processes: a resent conversation takes the row that holds its prefix
(usage.prompt_tokens_details.cached_tokens says how much), the least recently used row goes first, four chats that
share a system prompt keep their own rows, a re-plan leaves no row trusted, and every answer is the one computed
from scratch (`cache_prompt: false`), greedy and seeded, in float32 (the tiny Llama) and in the CPU's defaults (the
real SmolLM2 in bfloat16 and int4)."""
from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import pytest
import trio

from serving import KEY, Server, client

N = 8  # tokens per answer
SYSTEM = "you are the ring. " + "speculative decoding drafts tokens and the ring verifies them in one pass. " * 4
QUESTIONS = ["the quick brown fox", "hello world, this is a tiny tokenizer", "def fib(n): return n",
             "quantum entanglement pipeline parallelism"]
SEEDED = {"temperature": 0.9, "seed": 7}


def start(tiny_llama, tmp_path_factory, *args: str) -> Server:
    s = Server(tiny_llama, tmp_path_factory.mktemp("warm") / "serve.log", "--draft", "ngram", *args, peers=2)
    s.wait_until(lambda h: sum(m["layers"] not in ("", "none") for m in h["members"]) == 3, what="a ring of three")
    return s


@pytest.fixture(scope="module")
def server(tiny_llama, tmp_path_factory):  # float32 (the suite pins it), 4 rows: --max-conversations' default
    s = start(tiny_llama, tmp_path_factory)
    yield s
    s.close()


@pytest.fixture(scope="module")
def defaults(smollm2, tmp_path_factory):
    """The real SmolLM2 in the CPU's defaults (nothing pinned: bfloat16 and int4 where the CPU multiplies bfloat16
    natively), with the shipped draft."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("SFCHAT_CPU_DTYPE", raising=False)
        mp.delenv("SFCHAT_CPU_QUANT", raising=False)
        s = Server(Path("smollm2-135m"), tmp_path_factory.mktemp("warm") / "serve.log", peers=2)
    yield s
    s.close()


def ask(c: openai.OpenAI, model: str, messages: list[dict], stream: bool = False, cache: bool = True,
        **sampling) -> tuple[str, int, int]:
    """(answer, cached_tokens, prompt_tokens), whole or streamed with usage."""
    kw = dict(model=model, messages=messages, max_tokens=N, extra_body={"cache_prompt": cache},
              **({"temperature": 0} | sampling))
    if not stream:
        r = c.chat.completions.create(**kw)
        return r.choices[0].message.content, r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens
    chunks = list(c.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    u = chunks[-1].usage
    return "".join(ch.choices[0].delta.content or "" for ch in chunks[:-1]), u.prompt_tokens_details.cached_tokens, \
        u.prompt_tokens


def chat(c, model: str, questions: list[str], system: str = SYSTEM, **kw) -> list[tuple[str, int, int]]:
    """A chat that resends its whole history every turn, as chat UIs do."""
    messages, out = [{"role": "system", "content": system}], []
    for q in questions:
        messages.append({"role": "user", "content": q})
        out.append(ask(c, model, messages, **kw))
        messages.append({"role": "assistant", "content": out[-1][0]})
    return out


def check_exact(server, sampling: dict) -> None:
    """Each turn's answer, from the warm row (streamed) and from scratch (whole), is the same; from the second turn
    on the warm row held at least 80% of the prompt."""
    c = client(server)
    warm = chat(c, server.model, QUESTIONS[:3], stream=True, **sampling)
    cold = chat(c, server.model, QUESTIONS[:3], cache=False, **sampling)
    assert [a for a, _, _ in warm] == [a for a, _, _ in cold]
    assert [k for _, k, _ in cold] == [0, 0, 0]
    assert all(k >= 0.8 * n for _, k, n in warm[1:]), warm


@pytest.mark.parametrize("sampling", [{}, SEEDED], ids=["greedy", "seeded"])
def test_a_resent_chat_reuses_its_row_and_answers_as_from_scratch(server, sampling):
    check_exact(server, sampling)


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [{}, SEEDED], ids=["greedy", "seeded"])
def test_in_the_cpu_defaults_too(defaults, sampling):
    check_exact(defaults, sampling)


def test_legacy_completions_report_and_reuse_it_too(server):
    c = client(server)
    first = "the lazy dog jumps over the quick brown fox and"
    a = c.completions.create(model=server.model, prompt=first, max_tokens=N, temperature=0)
    more = first + a.choices[0].text + " the ring verifies"
    r = c.completions.create(model=server.model, prompt=more, max_tokens=N, temperature=0)
    assert r.usage.prompt_tokens_details.cached_tokens >= a.usage.prompt_tokens
    chunks = list(c.completions.create(model=server.model, prompt=more, max_tokens=N, temperature=0, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"cache_prompt": False}))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 0
    assert "".join(ch.choices[0].text for ch in chunks[:-1]) == r.choices[0].text


def test_the_least_recently_used_row_goes_first(server):
    """Five conversations in turn on four rows: the fifth takes the first's row; the second's is still warm, and
    no member holds more rows than the endpoint keeps."""
    c = client(server)
    firsts = [[{"role": "user", "content": f"{i} {q}"}] for i, q in enumerate(QUESTIONS + ["0123456789 fox"])]
    answers = [ask(c, server.model, m) for m in firsts]
    second = firsts[1] + [{"role": "assistant", "content": answers[1][0]}, {"role": "user", "content": "and then"}]
    _, cached, _ = ask(c, server.model, second)
    assert cached >= answers[1][2]  # its own row: the whole first turn
    first = firsts[0] + [{"role": "assistant", "content": answers[0][0]}, {"role": "user", "content": "and then"}]
    _, cached, _ = ask(c, server.model, first)
    assert cached < answers[0][2] // 2  # its row went to the fifth (only the template's first tokens match another)
    h = server.health()
    assert h["conversations"]["warm"] <= 4 and all(m["conversations"] <= 4 for m in h["members"][1:])


def test_four_concurrent_chats_sharing_a_system_prompt_keep_their_own_rows(server):
    """Four chats turn by turn, each turn's four requests at once. (Not each chat at its own pace: a chat whose first
    request came after another's answer would take that row, which holds the shared system prompt, by design.)"""
    async def turn(c, messages: list, q: str, cache: bool) -> tuple[str, int, int]:
        messages.append({"role": "user", "content": q})
        r = await c.chat.completions.create(model=server.model, messages=messages, max_tokens=N, temperature=0,
                                            extra_body={"cache_prompt": cache})
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
        return r.choices[0].message.content, r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens

    async def main(cache: bool) -> list:
        c = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
        chats = [[{"role": "system", "content": SYSTEM}] for _ in range(4)]
        turns = [await asyncio.gather(*(turn(c, chats[i], (QUESTIONS[i:] + QUESTIONS[:i])[t], cache)
                                        for i in range(4))) for t in range(3)]
        return [list(chat) for chat in zip(*turns)]

    warm, cold = asyncio.run(main(True)), asyncio.run(main(False))
    assert [[a for a, _, _ in turns] for turns in warm] == [[a for a, _, _ in turns] for turns in cold]
    for turns in warm:  # each turn found its own chat's row: more than the shared system prompt, its last turn too
        assert all(k >= n_before for (_, _, n_before), (_, k, _) in zip(turns, turns[1:])), turns


def test_a_replan_leaves_no_warm_row_trusted(tiny_llama):
    """A re-plan is a new epoch: a warm row from before it is reused from position 0 (none of its positions is
    trusted), the answer is the one from scratch, and the row is reused again after."""
    from helpers import running_ring
    from peers.conversation.chat import eos_ids, load_tokenizer
    from peers.speculation.drafting import Drafter
    from sfchat.serve.conversations import Conversations
    from sfchat.serve.request import ChatRequest

    async def main() -> None:
        async with running_ring(tiny_llama, 2) as (host, _):
            tok = load_tokenizer(host.model_dir)
            conv = Conversations(host, tok, eos_ids(host.model_dir, host.config, tok), Drafter())

            async def answer(messages: list[dict], cache: bool = True) -> tuple[str, int]:
                job = conv.prepare(ChatRequest(model="m", messages=messages, max_tokens=N, temperature=0,
                                               cache_prompt=cache))
                pieces: list[str] = []
                out = await conv.run(job, lambda text, _: pieces.append(text))
                return "".join(pieces), out.cached_tokens

            messages = [{"role": "system", "content": SYSTEM}]
            cached, drafters = [], []
            for i, q in enumerate(QUESTIONS):
                if i == 2:
                    epoch = host.epoch
                    await host.replan()
                    assert host.epoch > epoch and conv.status()["warm"] == 0
                messages.append({"role": "user", "content": q})
                text, k = await answer(messages)
                drafters.append([r.drafter for r in conv.warm.rows])
                assert text == (await answer(messages, cache=False))[0]
                cached.append(k)
                messages.append({"role": "assistant", "content": text})
            assert cached[1] > 0 and cached[2] == 0 and cached[3] > 0, cached
            assert any(a is b for a in drafters[0] for b in drafters[1])  # a reused row's drafter came back with it
            # --no-prefix-cache: no row kept, every prompt read from scratch
            conv = Conversations(host, tok, eos_ids(host.model_dir, host.config, tok), Drafter(), prefix_cache=False)
            assert [(await answer(messages))[1] for _ in range(2)] == [0, 0] and conv.warm.rows == []

    trio.run(main)
