"""Exact where users run it: the real SmolLM2 under the CPU's defaults (nothing pinned: bfloat16 activations and
int4 weights where the CPU multiplies bfloat16 natively), through rings of real processes. A greedy answer is the
same tokens with the shipped draft, with none, with trees and rounds in flight, in one process or three; a seeded
one repeats whatever came before or beside it, through `sfchat serve` and the real `openai` client."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from serving import Server, client, user
from shared_ring import SharedRing, ask_in_process

pytestmark = pytest.mark.slow  # the real SmolLM2

PROMPTS = ["Explain quantum entanglement in simple terms.",
           "Write a Python function for the Fibonacci numbers with dynamic programming.",
           "What are the advantages of pipeline parallelism?"]
N = 48


@pytest.fixture(scope="module", autouse=True)
def defaults():
    """The suite pins float32 (tests/conftest.py) to compare with float32 transformers; here nothing is pinned."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("SFCHAT_CPU_DTYPE", raising=False)
        mp.delenv("SFCHAT_CPU_QUANT", raising=False)
        yield


@pytest.fixture(scope="module")
def ring(smollm2, defaults):
    r = SharedRing("--local-peers", "2")
    yield r
    r.close()


def greedy(ask, prompt: str, *args: str) -> list[int]:
    return ask(prompt, "--temperature", "0", "--max-new-tokens", str(N), *args)["token_ids"]


def test_the_defaults_are_bfloat16_and_int4(ring):
    async def host(r):
        return r.host.members_info()[0]
    info = ring.run(host)
    assert (info["dtype"], info["quant"]) == ("bfloat16", "int4"), info


@pytest.mark.parametrize("prompt", PROMPTS)
def test_a_greedy_answer_is_the_same_tokens_with_any_draft_on_any_ring(ring, prompt):
    alone = greedy(ask_in_process, prompt, "--local-peers", "0", "--draft", "none")
    assert greedy(ring.ask, prompt, "--draft", "none") == alone
    drafted = ring.ask(prompt, "--temperature", "0", "--max-new-tokens", str(N))
    assert drafted["stats"]["drafter"] == "smollm2-135m-draft" and drafted["stats"]["accepted"] > 0
    assert drafted["token_ids"] == alone
    assert greedy(ring.ask, prompt, "--tree-nodes", "8", "--in-flight", "3") == alone


def test_a_seeded_answer_repeats_with_or_without_drafts(ring):
    args = ("--temperature", "1.0", "--seed", "42", "--max-new-tokens", "32")
    first = ring.ask(PROMPTS[1], *args)["token_ids"]
    ring.ask(PROMPTS[2], "--max-new-tokens", "8")
    assert ring.ask(PROMPTS[1], *args)["token_ids"] == first
    assert ring.ask(PROMPTS[1], *args, "--draft", "none")["token_ids"] == first
    assert ring.ask(PROMPTS[1], *args, "--tree-nodes", "8")["token_ids"] == first


def test_serve_repeats_greedy_and_seeded_answers_alone_and_beside_others(smollm2, defaults, tmp_path):
    server = Server(Path("smollm2-135m"), tmp_path / "serve.log", peers=2)
    try:
        api = client(server)

        def ask(prompt: str, **kw) -> str:
            kw.setdefault("max_tokens", 24)
            r = api.chat.completions.create(model=server.model, messages=user(prompt), **kw)
            return r.choices[0].message.content

        greedy_answers = {ask(PROMPTS[0], temperature=0) for _ in range(3)}
        assert len(greedy_answers) == 1
        alone = [ask(p, temperature=0, max_tokens=48) for p in PROMPTS]
        with ThreadPoolExecutor(len(PROMPTS)) as pool:  # other conversations in the same passes, rounds in flight
            for _ in range(2):
                assert list(pool.map(lambda p: ask(p, temperature=0, max_tokens=48), PROMPTS)) == alone
        seeded = dict(temperature=1.0, seed=42)
        answers = []
        for other in PROMPTS[1:] + ["Name three colours."]:
            answers.append(ask(PROMPTS[0], **seeded))
            ask(other, temperature=0.7)
        with ThreadPoolExecutor(4) as pool:
            answers += list(pool.map(lambda _: ask(PROMPTS[0], **seeded), range(4)))
        assert len(set(answers)) == 1, answers
        assert len(greedy_answers | set(answers)) == 2  # (the seed did draw: not the greedy answer)
    finally:
        server.close()
