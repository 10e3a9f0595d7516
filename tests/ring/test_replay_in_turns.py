"""Two conversations answering when a re-plan comes (a member joined, say): each replays its positions in chunks
that take turns with the other's rounds. A round that waited in a batch while the re-plan ran becomes a replay; it
goes in chunks of its own, not inside that batch, where its chunks would wait for turns the batch itself held up
(10 s a chunk: the minute-long stall after a kill with two streams in flight)."""
from __future__ import annotations

import trio

from helpers import new_chat, reference_ids, replan_under_a_waiting_batch, running_ring
from peers.speculation.adaptive import KPolicy
from peers.speculation.drafting import Drafter
from peers.speculation.sampling import SamplingParams

# long enough that a replay goes in several chunks (peers/host/turns.py: SHARED_CHUNK positions while others answer)
PROMPTS = [" ".join(f"word{i} number{i}" for i in range(9)), " ".join(f"item {i}," for i in range(14))]
NEW = 12


async def answers_across_a_replan(model):
    out, rounds, started = {}, {0: 0, 1: 0}, False
    async with running_ring(model, 2) as (host, lp):
        async def one(i):
            nonlocal started

            def on_round(ev):
                nonlocal started
                if ev["event"] == "round":
                    rounds[i] += 1
                if min(rounds.values()) >= 2 and not started:
                    started = True
                    nursery.start_soon(replan_under_a_waiting_batch, host)

            _, r = await new_chat(host).reply(PROMPTS[i], drafter=Drafter(), params=SamplingParams(),
                                              policy=KPolicy(pinned=1), max_new_tokens=NEW, on_round=on_round)
            out[i] = r.token_ids

        epoch = host.epoch
        async with trio.open_nursery() as nursery:
            for i in range(2):
                nursery.start_soon(one, i)
        return out, host.epoch - epoch, host.turns.waited_out


def test_two_answers_replay_in_turns_across_a_replan(tiny_llama):
    out, replans, waited_out = trio.run(answers_across_a_replan, tiny_llama)
    assert replans == 1, "the re-plan did not come mid-answer"
    assert waited_out == 0, "a replay's chunk waited out its whole turn: the ring stalled"
    for i, prompt in enumerate(PROMPTS):
        assert out[i] == reference_ids(tiny_llama, prompt, NEW)
