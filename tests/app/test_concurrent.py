"""Many conversations on one ring: their passes travel it at once, each answer exact; re-plans wait their turn."""
from __future__ import annotations

import signal

import pytest
import trio
import trio.testing

from helpers import greedy_reply, running_ring
from peers.conversation.chat import eos_ids, load_tokenizer
from peers.speculation.adaptive import KPolicy
from peers.speculation.drafting import Drafter
from peers.plan.gate import PassGate
from peers.speculation.sampling import SamplingParams
from sfchat.serve.conversations import Conversations
from sfchat.serve.errors import ApiError


def test_gate_shares_passes_and_gives_replans_the_ring_alone():
    gate, log = PassGate(), []

    async def a_pass(name: str, seconds: float) -> None:
        async with gate.share():
            log.append((name, "in", gate.passes))
            await trio.sleep(seconds)
        log.append((name, "out"))

    async def a_replan() -> None:
        async with gate.alone():
            log.append(("replan", "in", gate.passes))
            await trio.sleep(0.05)
        log.append(("replan", "out"))

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(a_pass, "a", 0.1)
            n.start_soon(a_pass, "b", 0.1)
            await trio.sleep(0.01)
            n.start_soon(a_replan)
            await trio.sleep(0.01)
            n.start_soon(a_pass, "c", 0.01)  # arrives while the re-plan waits: goes after it

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))  # the sleeps order them, in virtual time
    assert [e[2] for e in log[:2]] == [1, 2]  # two passes in flight at once
    assert log.index(("replan", "in", 0)) > max(log.index(("a", "out")), log.index(("b", "out")))  # waited for both
    assert log.index(("c", "in", 1)) > log.index(("replan", "out"))  # and the later pass for it


def test_two_conversations_share_passes_on_the_ring_and_stay_exact(tiny_llama):
    prompts = ["the quick brown fox", "def fib(n)"]
    alone, together, shared = trio.run(sharing, tiny_llama, prompts)
    assert together == alone
    assert shared  # their rounds went round the ring in the same passes


async def sharing(tiny_llama, prompts):
    async with running_ring(tiny_llama, 2) as (host, _):
        alone = [await greedy_reply(host, p, 16) for p in prompts]
        before = host.batcher.batches, host.batcher.rounds
        together = [None, None]

        async def one(i: int) -> None:
            together[i] = await greedy_reply(host, prompts[i], 16)

        async with trio.open_nursery() as answers:
            for i in range(2):
                answers.start_soon(one, i)
        batches, rounds = host.batcher.batches - before[0], host.batcher.rounds - before[1]
    return alone, together, rounds > batches


def test_a_request_during_a_long_replan_is_a_503_and_the_next_one_waits_it_out(tiny_llama):
    """A re-plan has the ring alone while its members load; one held up (here: stopped) holds the re-plan up. A
    request that waits past replan_wait_s for it gets a 503 naming the re-plan, and one that comes meanwhile with
    time to wait goes on once the re-plan is over."""
    async def main() -> None:
        async with running_ring(tiny_llama, 1, dead_after_s=60.0) as (host, lp):  # stopped is not lost, here
            tok = load_tokenizer(host.model_dir)
            conv = Conversations(host, tok, eos_ids(host.model_dir, host.config, tok), Drafter(), replan_wait_s=0.3)
            # without --max-conversations: the rows every member's arena was planned with, as help and README say
            assert conv.limit == host.conversations == 4 and conv.status()["max"] == 4
            peer = lp.procs[0]
            peer.send_signal(signal.SIGSTOP)  # it will not say it took its span until it goes on
            try:
                async with trio.open_nursery() as n:
                    n.start_soon(host.replan)
                    with trio.fail_after(10):
                        while not host.planner.gate.replanning:
                            await trio.sleep(0.01)
                    with pytest.raises(ApiError) as e:
                        await conv.ring_ready()
                    assert e.value.status == 503 and e.value.code == "ring_replanning"
                    assert host.planner.gate.replanning  # (still: its member is still stopped)
                    conv.replan_wait_s = 30.0
                    waited = trio.Event()

                    async def next_request() -> None:
                        await conv.ring_ready()  # returns once the re-plan is over
                        waited.set()

                    n.start_soon(next_request)
                    await trio.testing.wait_all_tasks_blocked()
                    assert not waited.is_set()  # it waits, and is not refused
                    peer.send_signal(signal.SIGCONT)
                    with trio.fail_after(30):
                        await waited.wait()
                    assert not host.planner.gate.replanning
            finally:
                peer.send_signal(signal.SIGCONT)

    trio.run(main)


def test_a_long_prompt_takes_turns_with_an_answer_under_way(tiny_llama):
    """A short answer under way when a long prompt arrives ends before that prompt's prefill does: the prompt goes
    in chunks, each followed by a round of the answer, and its own answer is what it is alone."""
    from helpers import new_chat
    from peers.host.turns import SHARED_CHUNK

    long_prompt = "the quick brown fox jumps over the lazy dog " * 13  # about 420 tokens here
    short_new = 4

    async def main():
        async with running_ring(tiny_llama, 1) as (host, _):
            alone = await greedy_reply(host, long_prompt, 3)
            events, under_way, together, long_read = [], trio.Event(), [], []
            short_chat, long_chat = new_chat(host), new_chat(host)  # tokenizers loaded before either starts
            n_long = len(long_chat.tokenizer(long_prompt)["input_ids"])
            assert n_long > (short_new + 1) * SHARED_CHUNK

            def on_short_round(ev: dict) -> None:
                long_read.append(long_chat.rs.filled)  # how much of the long prompt the ring holds meanwhile
                under_way.set()

            async def short() -> None:
                _, r = await short_chat.reply("hi", drafter=Drafter(), params=SamplingParams(), policy=KPolicy(),
                                              max_new_tokens=short_new, on_round=on_short_round)
                events.append(("short answered", len(r.token_ids)))

            async def long() -> None:
                await under_way.wait()

                def on_round(ev: dict) -> None:
                    if not together:
                        events.append(("long prefilled", 0))
                    together.extend(ev["new"])

                await long_chat.reply(long_prompt, drafter=Drafter(), params=SamplingParams(), policy=KPolicy(),
                                      max_new_tokens=3, on_round=on_round)

            async with trio.open_nursery() as n:
                n.start_soon(short)
                n.start_soon(long)
        return events, alone, together, long_read, n_long

    events, alone, together, long_read, n_long = trio.run(main)
    assert events == [("short answered", short_new), ("long prefilled", 0)]
    assert any(0 < n < n_long for n in long_read), long_read  # its rounds came between the prompt's chunks
    assert together == alone
