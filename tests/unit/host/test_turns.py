"""Conversations take turns on the ring (peers/host/turns.py): a long pass lets every other answer have a pass
between two of its chunks, and never waits for one that is not answering."""
import trio

from peers.host.turns import Turns


def test_a_chunk_waits_for_each_other_answer_to_have_a_pass():
    async def main():
        turns, log = Turns(), []

        async def long_pass():
            with turns.answering("long"):
                for chunk in range(3):
                    if chunk:
                        await turns.let_others_go("long")
                    log.append(("long", chunk))
                    turns.went("long")
                    await trio.sleep(0.01)

        async def short(sid):
            with turns.answering(sid):
                for r in range(3):
                    await trio.sleep(0.05)  # drafting its next round
                    log.append((sid, r))
                    turns.went(sid)

        async with trio.open_nursery() as n:
            n.start_soon(short, "a")
            n.start_soon(short, "b")
            await trio.sleep(0)
            n.start_soon(long_pass)
        # between the long pass's chunks, a and b each had a pass
        marks = [i for i, (sid, _) in enumerate(log) if sid == "long"]
        for lo, hi in zip(marks, marks[1:]):
            assert {sid for sid, _ in log[lo + 1:hi]} == {"a", "b"}, log

    trio.run(main)


def test_alone_a_pass_does_not_wait():
    async def main():
        turns = Turns()
        with turns.answering("only"):
            with trio.fail_after(0.5):
                await turns.let_others_go("only")
            assert not turns.others("only")

    trio.run(main)


def test_a_stop_ends_the_wait():
    async def main():
        turns = Turns()
        with turns.answering("x"), turns.answering("y"):
            with trio.fail_after(1):
                await turns.let_others_go("x", stop=lambda: True)

    trio.run(main)
