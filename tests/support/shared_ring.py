"""A ring that the tests of one module share (from a module-scoped fixture), brought up by `sfchat ask`'s own
open_ring on a thread of its own: a ring lives in one trio.run, and each test's trio.run ends with the test."""
from __future__ import annotations

import threading

import trio

from sfchat.ask import answer
from sfchat.cli import parser
from sfchat.options import ring_options


def ask_options(prompt: str, *args: str):
    """The RingOptions of `sfchat ask PROMPT ARGS`, as the command line makes them."""
    return ring_options(parser().parse_args(["ask", prompt, *args]))


class SharedRing:
    def __init__(self, *ask_args: str):
        """The ring `sfchat ask ARGS` brings up (--model, --local-peers …), up until close()."""
        self.opts = ask_options("", *ask_args)
        self._up, self._error, self._token = threading.Event(), None, None
        self._thread = threading.Thread(target=self._main, name="shared ring", daemon=True)
        self._thread.start()
        self._up.wait()
        if self._token is None:  # it did not come up
            self._thread.join()
            raise self._error

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as e:  # noqa: BLE001 - raised again where the test waits: in __init__ or close()
            self._error = e
        finally:
            self._up.set()

    async def _serve(self) -> None:
        from sfchat.runtime import open_ring

        async with open_ring(self.opts, announce=False) as ring:
            self.ring, self._closing = ring, trio.Event()
            self._token = trio.lowlevel.current_trio_token()
            self._up.set()
            await self._closing.wait()

    def run(self, fn, *args):
        """`await fn(ring, *args)` in the ring's own trio loop (ring: sfchat.runtime.Ring); what it returns."""
        return trio.from_thread.run(fn, self.ring, *args, trio_token=self._token)

    def ask(self, prompt: str, *args: str) -> dict:
        """What `sfchat ask PROMPT --json ARGS` prints, answered on this ring (ARGS: how to answer, not the ring)."""
        return self.run(answer, prompt, ask_options(prompt, *args).answer)

    def close(self) -> None:
        trio.from_thread.run_sync(self._closing.set, trio_token=self._token)
        self._thread.join()
        if self._error is not None:
            raise self._error


def ask_in_process(prompt: str, *args: str) -> dict:
    """What `sfchat ask PROMPT --json ARGS` prints, on the ring ARGS bring up in this process, closed after: the
    command less the start of an interpreter of its own (a test of the command itself runs it: helpers.ask_json)."""
    ring = SharedRing(*args)
    try:
        return ring.ask(prompt, *args)
    finally:
        ring.close()
