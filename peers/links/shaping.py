"""Link shaping for the relay: a bandwidth cap, then a one-way delay with jitter, per direction.

Each chunk read from the source first waits for the token bucket (the cap: reading slower slows the sender
through TCP's own flow control), then is queued with a release time of arrival + delay ± jitter, never before
the previous chunk's (order kept). A second task writes each chunk out at its time. The queue holds at most
QUEUE chunks of at most CHUNK bytes, so a slow receiver backs up into the sender, not into memory.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import trio

CHUNK = 16 * 1024
QUEUE = 64  # at most 1 MiB in flight per direction


@dataclass(frozen=True)
class Shaping:
    delay_ms: float = 0.0  # one way, each direction
    jitter_ms: float = 0.0  # each chunk's delay is delay ± jitter (uniform), order kept
    rate_mbit: float = 0.0  # bandwidth cap per direction; 0: none

    def __post_init__(self):
        if self.delay_ms < 0 or self.jitter_ms < 0 or self.rate_mbit < 0:
            raise ValueError("delay, jitter and rate must be >= 0")

    @property
    def active(self) -> bool:
        return bool(self.delay_ms or self.jitter_ms or self.rate_mbit)

    def __str__(self) -> str:
        if not self.active:
            return "no shaping"
        parts = [f"delay {self.delay_ms:g} ms"] + ([f"jitter {self.jitter_ms:g} ms"] if self.jitter_ms else [])
        return ", ".join(parts + ([f"rate {self.rate_mbit:g} Mbit/s"] if self.rate_mbit else []))


class TokenBucket:
    """Bytes may leave at `rate` per second with bursts of up to `burst`; a debt is paid by sleeping."""

    def __init__(self, rate: float, burst: int = CHUNK):
        self.rate, self.burst = rate, burst
        self.tokens, self.t = float(burst), trio.current_time()

    async def take(self, n: int) -> None:
        now = trio.current_time()
        self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate) - n
        self.t = now
        if self.tokens < 0:
            await trio.sleep(-self.tokens / self.rate)


async def pump(src: trio.abc.ReceiveStream, dst: trio.abc.SendStream, shaping: Shaping, count=None) -> None:
    """Copy src to dst until src's EOF, shaped. `count(n)` sees every chunk forwarded."""
    count = count or (lambda n: None)
    if not shaping.active:  # the plain path: one chunk in flight, nothing queued
        while data := await src.receive_some(CHUNK):
            await dst.send_all(data)
            count(len(data))
        return
    bucket = TokenBucket(shaping.rate_mbit * 1e6 / 8) if shaping.rate_mbit else None
    rng = random.Random()
    send, recv = trio.open_memory_channel(QUEUE)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_release, recv, dst, count)
        async with send:
            last = 0.0
            while data := await src.receive_some(CHUNK):
                if bucket is not None:
                    await bucket.take(len(data))
                delay = shaping.delay_ms + (rng.uniform(-shaping.jitter_ms, shaping.jitter_ms) if shaping.jitter_ms else 0)
                last = max(trio.current_time() + max(delay, 0.0) / 1e3, last)
                await send.send((last, data))  # blocks when QUEUE chunks are waiting: backpressure


async def _release(recv: trio.MemoryReceiveChannel, dst: trio.abc.SendStream, count) -> None:
    async with recv:
        async for at, data in recv:
            await trio.sleep_until(at)
            await dst.send_all(data)
            count(len(data))
