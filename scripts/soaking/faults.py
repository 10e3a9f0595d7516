"""The faults, one at a time, each once the ring is whole again after the one before:
- every F seconds a random member SIGKILLed and started again with its same command;
- between the first and second kills, and every fourth period after, a member SIGSTOPped for 2 to 20 s and
  continued (past the host's heartbeat limit it is lost and joins again by itself; under it, nothing happens);
- a quarter period after each kill, a partition: the link into a member that holds layers (from the host, or
  from the member before it) cut at the relay, closed with a FIN or blackholed (open and silent);
- once, an idle spell: no request for longer than every timeout of the ring (shortened in the soak).
And the watch: exits nobody asked for (crashes), the ring's re-plans, and the windows during which a fault was
being recovered from."""
from __future__ import annotations

import asyncio
import random
import signal
import time

from .relay import RelayThread
from .ring import Ring
from .tally import Tally

PAUSE_S = (2.0, 20.0)  # how long a stopped member stays stopped
RECOVERY_GRACE_S = 5  # no fault this close to the end: the last requests see it recovered from
RECOVERY_LIMIT_S = 300  # a ring not whole again by then is noted (the load's requests say the rest)


class Faults:
    def __init__(self, ring: Ring, relay: RelayThread, tally: Tally, every_s: float, idle_s: float, seed: int = 0):
        self.ring, self.relay, self.tally, self.every_s, self.idle_s = ring, relay, tally, every_s, idle_s
        self.rng = random.Random(seed)
        self.windows: list[list[float]] = []  # [start, end] of each fault until the ring was whole again
        self.idle_until = 0.0  # the load sends nothing new before this

    def overlapped(self, t0: float, t1: float) -> bool:
        return any(a <= t1 and (b is None or b >= t0) for a, b in self.windows)

    def _begin(self, kind: str) -> list:
        window = [time.monotonic(), None]
        self.windows.append(window)
        self.tally.faults.append((kind, window[0], time.time()))
        return window

    async def _recovered(self, window: list) -> None:
        ok = await asyncio.to_thread(self.ring.wait_ready, RECOVERY_LIMIT_S)
        window[1] = time.monotonic()
        if not ok:
            self.tally.note(f"the ring was not whole again {RECOVERY_LIMIT_S} s after a fault")

    async def run(self, deadline: float) -> None:
        start, lock = time.monotonic(), asyncio.Lock()

        async def on_ticks(first: float, period: float, fault) -> None:
            tick = start + first
            while tick + RECOVERY_GRACE_S < deadline:
                await asyncio.sleep(max(tick - time.monotonic(), 0))
                async with lock:
                    if time.monotonic() + RECOVERY_GRACE_S < deadline:
                        await fault()
                tick += period

        async with asyncio.TaskGroup() as tg:
            tg.create_task(on_ticks(self.every_s, self.every_s, self.kill))
            tg.create_task(on_ticks(1.5 * self.every_s, 4 * self.every_s, self.stop))
            tg.create_task(on_ticks(1.25 * self.every_s, self.every_s, self.cut))
            tg.create_task(on_ticks(0.6 * (deadline - start), deadline - start, self.idle))

    async def kill(self) -> None:
        m = self.rng.choice(self.ring.members)
        window = self._begin("kill")
        await asyncio.to_thread(m.kill)
        self.tally.killed += 1
        m.start()  # its same command
        await self._recovered(window)

    async def stop(self) -> None:
        """Continued after 2 to 20 s: past the heartbeat limit the host loses it and it joins again by itself
        (--stay); a shorter pause must cost nothing but the pause."""
        m, pause = self.rng.choice(self.ring.members), self.rng.uniform(*PAUSE_S)
        window = self._begin("stop")
        m.signal(signal.SIGSTOP)
        self.tally.stopped += 1
        await asyncio.sleep(pause)
        m.signal(signal.SIGCONT)
        await self._recovered(window)

    async def cut(self) -> None:
        """The link into a member holding layers cut at the relay: from the host (the first member's) or from
        the member before it; closed (a FIN) or blackholed (no FIN, no RST: silence)."""
        order = await asyncio.to_thread(self.ring.ring_order)
        if not order:
            return
        i, hole = self.rng.randrange(len(order)), self.rng.random() < 0.5
        window = self._begin("blackhole" if hole else "cut")
        if await asyncio.to_thread(self.relay.cut, order[i], hole):
            self.tally.cut += 1
        await self._recovered(window)

    async def idle(self) -> None:
        """No new request for idle_s (every answer under way ends first): the ring sits idle past its timeouts."""
        self.idle_until = time.monotonic() + self.idle_s
        self.tally.idled += 1
        await asyncio.sleep(self.idle_s)

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
