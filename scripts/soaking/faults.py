"""The faults: every F seconds a random member SIGKILLed and started again with its same command, now and then
one SIGSTOPped past the host's heartbeat limit and continued. And the watch: exits nobody asked for (crashes),
the ring's re-plans, and the windows during which a fault was being recovered from."""
from __future__ import annotations

import asyncio
import random
import signal
import time

from .ring import Ring
from .tally import Tally

DEAD_AFTER_S = 4.0  # the host's limit for a silent member (peers/base/options.py, HostOptions.dead_after_s)
RECOVERY_GRACE_S = 5  # no fault this close to the end: the last requests see it recovered from
RECOVERY_LIMIT_S = 300  # a ring not whole again by then is noted (the load's requests say the rest)


class Faults:
    def __init__(self, ring: Ring, tally: Tally, every_s: float, seed: int = 0):
        self.ring, self.tally, self.every_s = ring, tally, every_s
        self.rng = random.Random(seed)
        self.windows: list[list[float]] = []  # [start, end] of each fault until the ring was whole again

    def overlapped(self, t0: float, t1: float) -> bool:
        return any(a <= t1 and (b is None or b >= t0) for a, b in self.windows)

    async def _recovered(self, window: list) -> None:
        ok = await asyncio.to_thread(self.ring.wait_ready, RECOVERY_LIMIT_S)
        window[1] = time.monotonic()
        if not ok:
            self.tally.note(f"the ring was not whole again {RECOVERY_LIMIT_S} s after a fault")

    async def run(self, deadline: float) -> None:
        """A kill every `every_s` (on the tick, or once the ring is whole again if it is not yet); between the
        first and second kills, and every fourth period after, a stop too. One fault at a time."""
        start, lock = time.monotonic(), asyncio.Lock()

        async def on_ticks(first: float, period: float, fault) -> None:
            tick = start + first
            while tick + RECOVERY_GRACE_S < deadline:
                await asyncio.sleep(max(tick - time.monotonic(), 0))
                async with lock:
                    if time.monotonic() + RECOVERY_GRACE_S < deadline:
                        await fault(self.rng.choice(self.ring.members))
                tick += period

        async with asyncio.TaskGroup() as tg:
            tg.create_task(on_ticks(self.every_s, self.every_s, self.kill))
            tg.create_task(on_ticks(1.5 * self.every_s, 4 * self.every_s, self.stop))

    async def kill(self, m) -> None:
        window = [time.monotonic(), None]
        self.windows.append(window)
        await asyncio.to_thread(m.kill)
        self.tally.killed += 1
        m.start()  # its same command
        await self._recovered(window)

    async def stop(self, m) -> None:
        """Past the heartbeat limit: the host loses it; continued, it joins again by itself (--stay)."""
        window = [time.monotonic(), None]
        self.windows.append(window)
        m.signal(signal.SIGSTOP)
        self.tally.stopped += 1
        await asyncio.sleep(DEAD_AFTER_S + 2)
        m.signal(signal.SIGCONT)
        await self._recovered(window)

    async def watch(self, deadline: float) -> None:
        """Exits nobody asked for (a member is started again; the host's ends the soak), and re-plans."""
        epoch = None
        while time.monotonic() < deadline:
            for p in self.ring.procs:
                if p.popen is not None and p.popen.poll() is not None and not p.expected_exit:
                    self.tally.crashes += 1
                    self.tally.note(f"{p.name} exited with {p.popen.returncode} (see {p.log})")
                    if p is self.ring.host:
                        raise RuntimeError(f"the host exited with {p.popen.returncode}: see {p.log}")
                    p.start()
            try:
                e = (await asyncio.to_thread(self.ring.health))["epoch"]
                if epoch is not None and e != epoch:
                    self.tally.replans += e - epoch if e > epoch else 1
                epoch = e
            except Exception as e:  # noqa: BLE001 - the health route failing is itself worth a line
                self.tally.note(f"/health failed: {type(e).__name__}: {e}")
            await asyncio.sleep(0.5)
