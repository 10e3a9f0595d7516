"""The relay the soak's members are reached through (peers.links.relay, on a thread of its own), so that the soak
can cut the ring's links: closed with a FIN, or blackholed (open and silent, as a cut cable looks)."""
from __future__ import annotations

import threading

import trio

from peers.links.relay import Relay


class RelayThread:
    def __init__(self):
        self.relay, self.address = Relay(), ""
        self._ready = threading.Event()
        self._token = self._stop = None
        self._thread = threading.Thread(target=trio.run, args=(self._main,), name="soak-relay", daemon=True)

    async def _main(self) -> None:
        self._token, self._stop = trio.lowlevel.current_trio_token(), trio.Event()
        async with trio.open_nursery() as nursery:
            self.address = await nursery.start(self.relay.serve, "127.0.0.1:0")
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def start(self) -> str:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the soak's relay did not start")
        return self.address

    def cut(self, endpoint: str, hole: bool) -> int:
        """End every live link into `endpoint` (closed, or blackholed); how many."""
        return trio.from_thread.run_sync(self.relay.cut, endpoint, hole, trio_token=self._token)

    def close(self) -> None:
        if self._stop is not None:
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            self._thread.join(10)
