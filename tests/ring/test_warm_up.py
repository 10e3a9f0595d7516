"""A member that holds layers and goes silent is usually lost a moment later; meanwhile the ring waits on it. So the
host and the other members load, as spares, what a plan without it would give them (peers/compute/spares.py), and
the re-plan that follows its loss reads nothing: the host's new layers are the very modules it warmed up."""
import math
import os
import signal
import time

import trio

from helpers import new_chat, reference_ids, running_ring
from peers.speculation.adaptive import KPolicy
from peers.speculation.drafting import Drafter
from peers.speculation.sampling import SamplingParams
from sfchat.local import local_name
from tiny import make_model

PROMPT = "the quick brown fox jumps over the lazy dog"
N = 16


def test_the_others_warm_up_a_silent_members_layers_and_its_loss_reads_nothing(tmp_path):
    model = make_model(tmp_path / "twelve", layers=12)  # split over three: the host gains layers when one is lost

    async def main():
        async with running_ring(model, 2, placement="memory") as (host, lp):
            host.auto_replan = True
            await trio.sleep(1.5)  # a few pongs
            host.planner.spares.layers.clear()  # (what earlier plans left: not warmed up)
            victim = host.ring[-1]
            names = [local_name(i) for i in range(len(lp.procs))]
            proc = lp.procs[names.index(victim.name)]
            epoch = host.epoch
            proc.send_signal(signal.SIGSTOP)
            try:
                with trio.fail_after(10):
                    while not host.planner.spares.layers:
                        await trio.sleep(0.02)
                warmed = dict(host.planner.spares.layers)
                assert victim.state != "lost", "warmed up before the loss, not after"
                with trio.fail_after(20):
                    while host.epoch == epoch or not host.planner.healthy():
                        await trio.sleep(0.05)
                held = host.shard.held()
                assert warmed and all(held.get(i) is layer for i, layer in warmed.items()), (sorted(warmed),
                                                                                            host.shard.span)
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            _, r = await new_chat(host).reply(PROMPT, drafter=Drafter(), params=SamplingParams(), policy=KPolicy(),
                                              max_new_tokens=N)
            return r.token_ids

    assert trio.run(main) == reference_ids(model, PROMPT, N)


def test_a_member_whose_hold_ends_before_the_loss_warms_up_what_the_loss_gives_it(tmp_path):
    """The warm-up plans as the loss will: a member held out now but free again before the silent one is lost is
    planned in by that loss, so it is told to warm up the very span the re-plan then gives it; and the end of its
    hold, meanwhile, makes no re-plan of its own (another replay of every conversation)."""
    model = make_model(tmp_path / "twelve", layers=12)

    async def main():
        async with running_ring(model, 2, placement="memory") as (host, lp):
            host.auto_replan = True
            await trio.sleep(1.5)
            victim, other = host.ring[-1], host.ring[-2]
            told, tell, prepare = [], host.roster.tell, host.roster.on_suspect

            async def recording_tell(members, msg, timeout=math.inf):
                told.extend((m.name, msg) for m in members if msg.get("t") == "warm")
                await tell(members, msg, timeout)

            def suspect(m):  # the other member is held out now, free again halfway to the victim's loss
                now = time.monotonic()
                left = m.silent_limit(host.roster.dead_after_s) - (now - m.last_seen)
                host.planner.holds.until[other.name] = now + left / 2
                host._held(other, left / 2)  # (its release then waits for the loss, which plans it in)
                prepare(m)

            host.roster.tell, host.roster.on_suspect = recording_tell, suspect
            names = [local_name(i) for i in range(len(lp.procs))]
            proc = lp.procs[names.index(victim.name)]
            epoch = host.epoch
            proc.send_signal(signal.SIGSTOP)
            try:
                with trio.fail_after(20):
                    while host.epoch == epoch or not host.planner.healthy():
                        await trio.sleep(0.05)
                await trio.sleep(1.5)
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            assert host.epoch == epoch + 1, "one re-plan: the loss's, not another as the hold ended"
            assert other in host.ring and other.span.size, "the loss's re-plan planned the member whose hold ended"
            assert told == [(other.name, {"t": "warm", "start": other.span.start, "end": other.span.end})]

    trio.run(main)
