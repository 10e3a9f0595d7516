"""A member lost twice within a minute is held out: when it joins again it gets no layers (a spare, shown as held)
until its hold ends, and the ring is then planned over it again by itself; answers stay exact throughout."""
import trio

from helpers import greedy_reply, reference_ids, running_ring

PROMPT = "the quick brown fox jumps over the lazy dog"
NONE = ("", "none")  # a member's row's layers where it holds none


def test_a_member_lost_twice_within_a_minute_is_held_out_then_planned_in_again(tiny_llama, monkeypatch):
    monkeypatch.setenv("SFCHAT_HOLD_S", "4")  # (15 s in use)

    def row(host, name):
        return next((r for r in host.members_info()[1:] if r["name"] == name and r["state"] not in ("lost", "failed")),
                    None)

    async def wait_for(host, what, seconds=60):
        with trio.fail_after(seconds):
            while not what() or host.replanning:
                await trio.sleep(0.05)

    async def main():
        async with running_ring(tiny_llama, 2, placement="memory") as (host, lp):
            host.auto_replan = True
            seen = []
            for _ in range(2):
                b = next(m for m in host.members if m.name == "local-b" and m.state != "lost")
                lp.procs[1].kill()  # local-b
                await wait_for(host, lambda: b.state == "lost" and lp.procs[1].poll() is not None)
                lp.revive()  # the same command: it joins again, under its name
                await wait_for(host, lambda: (r := row(host, "local-b")) and r["state"] in ("ready", "held"))
                seen.append(row(host, "local-b"))
            answer_while_held = await greedy_reply(host, PROMPT, 12)
            await wait_for(host, lambda: row(host, "local-b")["state"] == "ready", 30)
            return seen, answer_while_held, row(host, "local-b"), await greedy_reply(host, PROMPT, 12)

    seen, while_held, after, answer = trio.run(main)
    assert seen[0]["state"] == "ready" and seen[0]["layers"] not in NONE and not seen[0]["held_s"], seen[0]
    assert seen[1]["state"] == "held" and seen[1]["layers"] in NONE and 0 < seen[1]["held_s"] <= 4, seen[1]
    assert after["layers"] not in NONE and after["held_s"] == 0, after
    assert while_held == answer == reference_ids(tiny_llama, PROMPT, 12)
