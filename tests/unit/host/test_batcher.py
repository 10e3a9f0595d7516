"""The host's batcher (peers/host/batcher.py) alone: rounds ready together go in one pass, a late conversation
whose last round just came back is waited for a little, and a failed pass fails each of its rounds."""
from types import SimpleNamespace

import pytest
import trio

from peers.host.batcher import Batcher, Round


def rnd(sid):
    return Round(SimpleNamespace(sid=sid), tokens=[1], drafts=[], parents=None, sent=None)


def run_with(run_batch, body):
    async def main():
        b = Batcher(run_batch)
        async with trio.open_nursery() as n:
            n.start_soon(b.run)
            await body(b)
            n.cancel_scope.cancel()

    trio.run(main)


def test_rounds_ready_together_share_one_pass_and_each_gets_its_result():
    sizes = []

    async def run_batch(batch):
        sizes.append(len(batch))
        await trio.sleep(0.01)
        for r in batch:
            r.result = r.s.sid

    async def body(b):
        got = {}

        async def one(sid):
            got[sid] = await b.submit(rnd(sid))

        async with trio.open_nursery() as n:
            for sid in "abc":
                n.start_soon(one, sid)
        assert got == {"a": "a", "b": "b", "c": "c"} and sizes == [3]
        # the next rounds: b comes 2 ms after a, and is waited for since its last round just came back (within a
        # window widened here so that a loaded machine's scheduling does not decide the test)
        b.window.s = 0.045
        async with trio.open_nursery() as n:
            n.start_soon(one, "a")
            await trio.sleep(0.002)
            n.start_soon(one, "b")
        assert sizes[1:] == [2]

    run_with(run_batch, body)


def test_a_failed_pass_fails_each_of_its_rounds():
    async def run_batch(batch):
        raise ConnectionError("the ring broke")

    async def body(b):
        with pytest.raises(ConnectionError, match="the ring broke"):
            await b.submit(rnd("a"))

    run_with(run_batch, body)
