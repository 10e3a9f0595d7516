"""A host that does not run for longer than its members' old patience (a laptop lid, a VM hiccup, SIGSTOP, work that
blocks its event loop): its members wait for it, and when it runs again nothing is lost and nothing re-planned:
the members keep their links and layers, the host counts its own stall against no member, and the next answer
is the one before. (This process cannot SIGSTOP itself: its loop blocked for as long stands in.)"""
import time

import trio

from helpers import greedy_reply, running_ring

PROMPT = "the quick brown fox jumps over the lazy dog"
N = 12
PAUSE_S = 16.0  # past the 15 s of silence after which a member used to give its host up


def test_members_wait_out_a_paused_host(tiny_llama):
    async def main():
        async with running_ring(tiny_llama, 2) as (host, lp):
            host.auto_replan = True
            before = await greedy_reply(host, PROMPT, N)
            epoch, ring = host.epoch, [(m.name, str(m.span)) for m in host.ring]
            time.sleep(PAUSE_S)  # the host does not run: no pings, no keepalives, nothing read
            await trio.sleep(3)  # the host's heartbeat limit (2.5 s) passes with it running again
            after = await greedy_reply(host, PROMPT, N)
            return (before, after, epoch, host.epoch, ring, [(m.name, str(m.span)) for m in host.ring],
                    [m.state for m in host.members], [p.poll() for p in lp.procs])

    before, after, epoch, epoch_after, ring, ring_after, states, exits = trio.run(main)
    assert exits == [None, None], "a member gave its host up"
    assert states == ["ready", "ready"] and ring_after == ring, (states, ring_after)
    assert epoch_after == epoch, "the ring was re-planned or re-wired"
    assert after == before
