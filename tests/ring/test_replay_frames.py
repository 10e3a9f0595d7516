"""Conversations whose rounds wait in one batch while a re-plan runs replay from their first position: their
rounds then go in frames of their own, all on the wire at once (peers/host/rounds.py), each conversation answered
as its own frame comes back, and every answer exact."""
from __future__ import annotations

import trio

from helpers import new_chat, reference_ids, replan_under_a_waiting_batch, running_ring
from peers.speculation.adaptive import KPolicy
from peers.speculation.drafting import Drafter
from peers.speculation.sampling import SamplingParams

PROMPTS = ["the quick brown fox jumps over the lazy dog", "one two three four five six seven",
           "red green blue yellow orange purple"]
NEW = 10


def test_replays_after_a_replan_go_in_frames_of_their_own_and_stay_exact(tiny_llama):
    async def main():
        out, frames, started = {}, [], False
        async with running_ring(tiny_llama, 2) as (host, lp):
            alone = host._frame_alone

            async def frame_alone(rounds):
                frames.append([r.s.sid for r in rounds])
                await alone(rounds)
            host._frame_alone = frame_alone

            async def one(i):
                nonlocal started

                def on_round(ev):
                    nonlocal started
                    if ev["event"] == "round" and not started and len(out) == 0 and ev["round"]["batch"] == 3:
                        started = True
                        nursery.start_soon(replan_under_a_waiting_batch, host)

                _, r = await new_chat(host).reply(PROMPTS[i], drafter=Drafter(), params=SamplingParams(),
                                                  policy=KPolicy(pinned=1), max_new_tokens=NEW, on_round=on_round)
                out[i] = r.token_ids

            async with trio.open_nursery() as nursery:
                for i in range(3):
                    nursery.start_soon(one, i)
        return out, frames

    out, frames = trio.run(main)
    assert len(frames) >= 2 and all(len(f) == 1 for f in frames), frames
    for i, prompt in enumerate(PROMPTS):
        assert out[i] == reference_ids(tiny_llama, prompt, NEW)
