"""A process's own stalls (peers/base/stalls.py): the loop blocked, or the process stopped, is named in one warning,
and a kept-alive link's silence across it is not taken for the link's death (peers/links/channel.py); a link
silent while its writer runs is still dead at its limit. The same holds for a host paused with SIGSTOP: this
process cannot stop itself, so a blocked loop stands in for it."""
import logging
import time

import pytest
import trio

from peers.base.stalls import STALLS
from peers.links.channel import ChannelIdle
from peers.links.liveness import keep_alive, watched
from test_channel_and_auth import pair

SILENT_S = 0.6


def a_long_computation_on_the_loop():
    time.sleep(1.6)


def test_a_blocked_loop_is_named_once_and_its_silence_is_excused(monkeypatch, caplog):
    monkeypatch.setenv("SFCHAT_LINK_SILENT_S", str(SILENT_S))
    caplog.set_level(logging.WARNING, "sfchat.loop")

    async def main():
        a, b = await pair()
        watched(b)
        got = []
        async with trio.open_nursery() as n:
            n.start_soon(STALLS.run)
            await n.start(keep_alive, a)

            async def read():
                while True:
                    got.append(await b.recv())

            n.start_soon(read)
            await trio.sleep(0.3)
            a_long_computation_on_the_loop()  # the writer and the reader are held up alike
            await trio.sleep(3 * SILENT_S)  # the reader reads on: it heard nothing because nothing here ran
            n.cancel_scope.cancel()
        return got

    trio.run(main)
    warnings = [r.getMessage() for r in caplog.records if r.name == "sfchat.loop"]
    assert len(warnings) == 1 and "a_long_computation_on_the_loop" in warnings[0], warnings


def test_a_silent_link_is_still_dead_at_its_limit(monkeypatch):
    monkeypatch.setenv("SFCHAT_LINK_SILENT_S", str(SILENT_S))

    async def main():
        a, b = await pair()
        watched(b)
        async with trio.open_nursery() as n:
            n.start_soon(STALLS.run)
            with trio.fail_after(30), pytest.raises(ChannelIdle):
                await b.recv()  # its writer runs, but sends nothing: a cut link
            n.cancel_scope.cancel()

    trio.run(main)
