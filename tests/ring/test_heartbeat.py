"""A silent member (stopped, cut off: no FIN ever comes) is noticed in about 3 s with the default heartbeat, and a
slow one is never taken for a dead one: the limit is never under 5x the member's p99 pong, and a member stopped
for 2 s mid-answer is not planned out at all."""
import os
import signal
import time

import trio

from helpers import new_chat, reference_ids, running_ring
from peers.plan.roster import Member
from peers.speculation.adaptive import KPolicy
from peers.speculation.drafting import Drafter
from peers.speculation.sampling import SamplingParams
from sfchat.local import local_name
from tiny import make_model

PROMPT = "the quick brown fox jumps over the lazy dog"
N = 24


def test_the_silence_allowed_is_never_under_five_times_the_p99_pong():
    m = Member(1, "m", None, "a:1", "cpu", 0, "float32")
    assert m.silent_limit(3.0) == 3.0  # (too few pongs to judge yet)
    m.rtts.extend([0.001] * 200)
    assert m.silent_limit(3.0) == 3.0
    m.rtts.extend([0.9] * 5)  # a slow link: its p99 pong is 0.9 s
    assert m.silent_limit(3.0) == 4.5


def test_a_stopped_member_is_lost_within_a_few_heartbeats(tiny_llama):
    async def main():
        async with running_ring(tiny_llama, 2) as (host, lp):  # the default heartbeat
            await trio.sleep(1.5)  # a few pongs
            victim = host.ring[0]
            names = [local_name(i) for i in range(len(lp.procs))]  # (members are numbered as they joined)
            lp.procs[names.index(victim.name)].send_signal(signal.SIGSTOP)
            try:
                with trio.fail_after(10):
                    while victim.state != "lost":
                        await trio.sleep(0.02)
                return time.monotonic() - victim.last_seen  # from its last pong
            finally:
                for p in lp.procs:
                    os.kill(p.pid, signal.SIGCONT)

    took = trio.run(main)
    assert took < 3.9, f"a stopped member was lost {took:.1f} s after its last pong"


def test_a_member_stopped_for_two_seconds_is_not_planned_out(tiny_llama):
    async def main():
        async with running_ring(tiny_llama, 2) as (host, lp):
            host.auto_replan = True
            epoch, events, rounds = host.epoch, [], 0

            async def pause():
                lp.procs[0].send_signal(signal.SIGSTOP)
                await trio.sleep(2.0)
                lp.procs[0].send_signal(signal.SIGCONT)

            def on_round(ev):
                nonlocal rounds
                events.append(ev)
                rounds += ev["event"] == "round"
                if ev["event"] == "round" and rounds == 3:
                    nursery.start_soon(pause)

            async with trio.open_nursery() as nursery:
                _, r = await new_chat(host).reply(PROMPT, drafter=Drafter(), params=SamplingParams(),
                                                  policy=KPolicy(), max_new_tokens=N, on_round=on_round)
            assert not [e for e in events if e["event"] == "recovering"], events
            assert host.epoch == epoch and all(m.state == "ready" for m in host.ring)
            return r.token_ids

    assert trio.run(main) == reference_ids(tiny_llama, PROMPT, N)


def test_a_member_stopped_for_two_seconds_in_a_long_prefill_is_not_planned_out(tmp_path):
    """The prompt's prefill (2,000 positions of a wider model) is under way when a member stops for 2 s: the ring
    waits for it; nothing is re-planned, and the answer is exact."""
    model = make_model(tmp_path / "wide", "llama", layers=3, hidden=1024, intermediate_size=128,
                       num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096)
    prompt = " ".join([PROMPT] * 64)

    async def main():
        async with running_ring(model, 2, placement="memory") as (host, lp):
            host.auto_replan = True
            epoch, events = host.epoch, []
            assert all(m.span.size for m in host.ring)

            async def pause():
                await trio.sleep(0.1)  # the prefill has begun
                lp.procs[0].send_signal(signal.SIGSTOP)
                await trio.sleep(2.0)
                lp.procs[0].send_signal(signal.SIGCONT)

            def on_round(ev):
                events.append((time.monotonic() - t0, ev))

            t0 = time.monotonic()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pause)
                _, r = await new_chat(host).reply(prompt, drafter=Drafter(), params=SamplingParams(),
                                                  policy=KPolicy(), max_new_tokens=4, on_round=on_round)
            first = min(t for t, e in events if e["event"] == "round")
            assert first > 2.0, f"the prefill was done {first:.1f} s in: before the member stopped and went on"
            assert not [e for _, e in events if e["event"] == "recovering"], events
            assert host.epoch == epoch and all(m.state == "ready" for m in host.ring)
            return r.token_ids

    assert trio.run(main) == reference_ids(model, prompt, 4)


def test_a_member_back_right_after_its_loss_is_planned_in_a_moment_later(tiny_llama):
    """Paused just past its limit, a member is lost, and joins again while the conversations it held up replay:
    its re-plan (another replay for each) waits until JOIN_SETTLE_S after the one for its loss."""
    from peers.host.host import JOIN_SETTLE_S

    async def main():
        async with running_ring(tiny_llama, 2) as (host, lp):
            host.auto_replan = True
            await trio.sleep(1.5)  # a few pongs
            victim, epoch = host.ring[0], host.epoch
            names = [local_name(i) for i in range(len(lp.procs))]
            proc = lp.procs[names.index(victim.name)]
            proc.send_signal(signal.SIGSTOP)
            try:
                with trio.fail_after(10):
                    while host.epoch == epoch:
                        await trio.sleep(0.01)
            finally:
                proc.send_signal(signal.SIGCONT)
            lost_at, epoch = host.planner.planned_at, host.epoch
            with trio.fail_after(20):
                while not any(m.name == victim.name and m.state == "ready" for m in host.ring):
                    await trio.sleep(0.01)
            return host.planner.planned_at - lost_at

    assert trio.run(main) >= JOIN_SETTLE_S
