"""Many conversations on one ring: their passes travel it at once, each answer exact; re-plans wait their turn."""
from __future__ import annotations

import trio

from helpers import greedy_reply, running_ring
from peers.pass_gate import PassGate


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

    trio.run(main)
    assert [e[2] for e in log[:2]] == [1, 2]  # two passes in flight at once
    assert log.index(("replan", "in", 0)) > max(log.index(("a", "out")), log.index(("b", "out")))  # waited for both
    assert log.index(("c", "in", 1)) > log.index(("replan", "out"))  # and the later pass for it


def test_two_conversations_overlap_on_the_ring_and_stay_exact(tiny_llama):
    prompts = ["the quick brown fox", "def fib(n)"]
    alone, together, most = trio.run(overlapping, tiny_llama, prompts)
    assert together == alone
    assert most == 2  # both conversations had a pass on the ring at the same moment


async def overlapping(tiny_llama, prompts):
    async with running_ring(tiny_llama, 2) as (host, _):
        alone = [await greedy_reply(host, p, 16) for p in prompts]
        most = 0

        async def watch() -> None:
            nonlocal most
            while True:
                most = max(most, host.planner.gate.passes)
                await trio.sleep(0)

        together = [None, None]

        async def one(i: int) -> None:
            together[i] = await greedy_reply(host, prompts[i], 16)

        async with trio.open_nursery() as n:
            n.start_soon(watch)
            async with trio.open_nursery() as answers:
                for i in range(2):
                    answers.start_soon(one, i)
            n.cancel_scope.cancel()
    return alone, together, most
