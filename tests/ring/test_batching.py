"""Many conversations in one pass (peers/host/batcher.py, peers/compute/packed.py), on real rings of peer processes: each
conversation's greedy answer is token-identical to plain transformers whatever shares its passes (rounds of
different K, trees, no draft), when one of them is cancelled mid-answer, and when a member is lost mid-batch."""
from __future__ import annotations

import asyncio

import trio

from helpers import new_chat, reference_ids, running_ring
from peers.speculation.adaptive import KPolicy
from peers.host.batcher import Batcher, Round
from peers.compute.device import compute_id
from peers.speculation.drafting import Drafter
from peers.speculation.drafting.ngram import NgramDrafter
from peers.speculation.drafting.simulated import SimulatedDrafter
from peers.speculation.sampling import SamplingParams
from test_tree import OracleTrees, TreePolicy

PROMPTS = ["hello world", "the quick brown fox", "one two three four", "a b c d e f", "what is the capital",
           "sfchat splits a model", "good morning to you", "seven eight nine"]
NEW = 16


def prompt_ids(chat, prompt: str) -> list[int]:
    ids = chat.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                             tokenize=True)
    return list(ids["input_ids"] if not isinstance(ids, list) else ids)


def drafting(i: int, chat, prompt: str, want: list[int]):
    """Conversation i's drafter and policy: none, n-gram chains of 3, trees, or chains of 5 of known acceptance."""
    truth = prompt_ids(chat, prompt) + want
    return [(Drafter(), KPolicy()), (NgramDrafter(), KPolicy(pinned=3)), (OracleTrees(truth), TreePolicy()),
            (SimulatedDrafter(0.7, chat.tokenizer.vocab_size, [truth], seed=i), KPolicy(pinned=5))][i % 4]


async def answer_all(host, prompts: list[str], wants: dict, on_round=None, cancel: set[int] = frozenset()):
    """Each prompt answered in its own conversation, all at once; {i: token ids} (None where cancelled)."""
    out = {}

    async def one(i, prompt):
        chat = new_chat(host)
        drafter, policy = drafting(i, chat, prompt, wants[prompt])
        with trio.CancelScope() as scope:
            def rounds(ev):
                if on_round is not None:
                    on_round(i, ev)
                if i in cancel and ev.get("event") == "round":
                    scope.cancel()  # mid-answer: its next pass may already be gathered with the others'
            _, r = await chat.reply(prompt, drafter=drafter, params=SamplingParams(), policy=policy,
                                    max_new_tokens=NEW, on_round=rounds)
            out[i] = r.token_ids
        if scope.cancelled_caught:
            out[i] = None
            await host.drop(chat.rs)

    async with trio.open_nursery() as nursery:
        for i, p in enumerate(prompts):
            nursery.start_soon(one, i, p)
    return out


def test_eight_conversations_in_shared_passes_each_answer_exactly(tiny_qwen2):
    wants = {p: reference_ids(tiny_qwen2, p, NEW) for p in PROMPTS}
    sizes = []

    async def main():
        async with running_ring(tiny_qwen2, 2, conversations=len(PROMPTS)) as (host, _):
            got = await answer_all(host, PROMPTS, wants, on_round=lambda i, ev: ev.get("event") == "round" and
                                   sizes.append(ev["round"].get("batch", 1)), cancel={5})
            # the host and both local peers compute on this machine's cores: one batch in flight at a time
            assert {m.compute for m in host.ring} == {compute_id(host.device)} and host.devices() == 1
            await trio.sleep(2.5)  # a pong from each member since its last frame
            # what the members computed, not how the host grouped: every frame that came back went through each
            # member once, and they were fewer than the conversations' rounds (rounds shared frames)
            assert [m.frames for m in host.ring] == [host.returns.answered] * 2
            assert 0 < host.returns.answered <= host.returns.sent < len(sizes)
            return got, host.batcher.batches, host.batcher.rounds

    got, batches, rounds = trio.run(main)
    for i, p in enumerate(PROMPTS):
        if i != 5:
            assert got[i] == wants[p], (i, p)
    assert got[5] is None
    assert rounds > batches and max(sizes) >= 4  # rounds did share passes


def test_batches_in_flight_are_as_many_as_the_ring_has_devices():
    """The batcher sends a batch while another is on the wire only up to `in_flight` (one per device)."""
    class Session:
        def __init__(self, sid):
            self.sid = sid

    def most_at_once(devices: int) -> int:
        flying, most = 0, 0

        async def run_batch(rounds):
            nonlocal flying, most
            flying += 1
            most = max(most, flying)
            await trio.sleep(0.02)
            flying -= 1
            for r in rounds:
                r.result = "done"

        async def main():
            b = Batcher(run_batch, limit=2, in_flight=lambda: devices)
            async with trio.open_nursery() as n:
                n.start_soon(b.run)
                async with trio.open_nursery() as clients:
                    for i in range(8):
                        clients.start_soon(b.submit, Round(Session(f"c{i}"), [1], [], None, None))
                n.cancel_scope.cancel()
        trio.run(main)
        return most

    assert most_at_once(1) == 1
    assert most_at_once(3) == 3


def test_a_member_lost_mid_batch_every_answer_goes_on_exactly(tiny_llama):
    prompts = PROMPTS[:6]
    wants = {p: reference_ids(tiny_llama, p, NEW) for p in prompts}

    async def main():
        async with running_ring(tiny_llama, 2) as (host, lp):
            killed = []

            def kill_once(i, ev):
                if ev.get("event") == "round" and not killed and ev["round"].get("batch", 1) > 1:
                    lp.procs[1].kill()  # local-b, the last member, while rounds share the ring
                    killed.append(i)

            got = await answer_all(host, prompts, wants, on_round=kill_once)
            return got, killed, [m.name for m in host.ring]

    got, killed, ring = trio.run(main)
    assert killed and ring == ["local-a"]
    for i, p in enumerate(prompts):
        assert got[i] == wants[p], (i, p)


def test_five_streamed_requests_at_once_answer_as_each_alone(tiny_llama, tmp_path):
    import openai
    from serving import KEY, Server

    prompts = PROMPTS[:5]
    server = Server(tiny_llama, tmp_path / "serve.log", peers=1)
    try:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)

        async def ask(prompt: str) -> str:
            stream = await client.chat.completions.create(
                model=server.model, messages=[{"role": "user", "content": prompt}], max_tokens=NEW, temperature=0,
                stream=True)
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

        async def main():
            alone = [await ask(p) for p in prompts]
            together = await asyncio.gather(*(ask(p) for p in prompts))
            return alone, together

        alone, together = asyncio.run(main())
        batched = server.health()
    finally:
        server.close()
    assert together == alone and all(alone)
    assert batched["passes"]["rounds"] > batched["passes"]["batches"]


def test_a_round_of_a_conversation_that_ended_is_answered_not_dropped(tiny_llama):
    """A member that gets a frame of a conversation the host has ended (the drop overtook it: a client gone
    mid-round) answers it with a failure. Dropped silently, the frame's pass waited a minute for its reply, holding
    the ring's batch in flight, and every other conversation's rounds with it."""
    import pytest

    from peers.base.errors import RingError

    async def main():
        async with running_ring(tiny_llama, 1) as (host, _):
            chat = new_chat(host)
            await chat.reply("hello world", drafter=Drafter(), params=SamplingParams(), policy=KPolicy(),
                             max_new_tokens=2)
            await host.drop(chat.rs)
            with trio.fail_after(30):  # the member has ended it
                while host.members_info()[1]["conversations"]:
                    await trio.sleep(0.05)
            with trio.fail_after(30), pytest.raises(RingError, match="conversations ended"):  # (unanswered: 60 s)
                await host.forward(chat.rs, chat.tokens + [5], [])
            return await new_chat(host).reply("hello world", drafter=Drafter(), params=SamplingParams(),
                                              policy=KPolicy(), max_new_tokens=4)

    _, r = trio.run(main)
    assert r.token_ids == reference_ids(tiny_llama, "hello world", 4)
