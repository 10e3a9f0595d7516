"""Many conversations in one pass: the host gathers the rounds that are ready and sends them round as one frame.

Each conversation has at most one round waiting (its answer waits for its pass), so a batch takes every round
ready when the ring is free. The conversations of the last batch draft their next round while it is delivered;
the next batch waits a little for them (about twice the time they have been taking, at most MAX_GATHER_S), so
they stay in step: none runs more than one pass behind another, and the weights are read once per pass for all.
A conversation that joins, or one that comes late, goes in the next batch.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import trio

MAX_BATCH = 16  # rounds in one pass (sfchat serve's --max-conversations bounds the conversations first)
MAX_GATHER_S = 0.05


@dataclass
class Round:
    """One conversation's pass, as Host.forward was asked for it, and what came of it."""

    s: object  # RingSession
    tokens: list[int]
    drafts: list[int]
    parents: list[int] | None
    sent: trio.Event | None
    done: trio.Event = field(default_factory=trio.Event)
    result: tuple | None = None
    error: BaseException | None = None
    queued: float = field(default_factory=time.monotonic)


class Batcher:
    """`run_batch(rounds)` computes one batch and sets each round's result or error."""

    def __init__(self, run_batch, limit: int = MAX_BATCH):
        self.run_batch, self.limit = run_batch, limit
        self._send, self._queue = trio.open_memory_channel(math.inf)
        self.expected: dict[str, float] = {}  # conversations of the last batch -> when their result was given
        self.gather_s = 0.005  # how long the last batch's conversations have been taking to come back (x2)
        self.batches = 0  # passes sent, for the statistics
        self.rounds = 0

    async def submit(self, r: Round) -> tuple:
        self._send.send_nowait(r)
        await r.done.wait()
        if r.error is not None:
            raise r.error
        return r.result

    def forget(self, sid: str) -> None:
        """A conversation that ended: the next batch does not wait for it."""
        self.expected.pop(sid, None)

    async def run(self) -> None:
        while True:
            batch = await self._gather()
            self.batches += 1
            self.rounds += len(batch)
            try:
                await self.run_batch(batch)
            except BaseException as e:  # every round of it fails alike; the loop serves the next
                for r in batch:
                    if not r.done.is_set():
                        r.error = e if isinstance(e, Exception) else RuntimeError("the pass was cancelled")
                        r.done.set()
                if not isinstance(e, Exception):
                    raise
            now = time.monotonic()
            self.expected = {r.s.sid: now for r in batch}
            for r in batch:
                r.done.set()

    async def _gather(self) -> list:
        batch = [await self._queue.receive()]
        deadline = time.monotonic() + self.gather_s
        while len(batch) < self.limit:
            while len(batch) < self.limit:
                try:
                    batch.append(self._queue.receive_nowait())
                except trio.WouldBlock:
                    break
            missing = set(self.expected) - {r.s.sid for r in batch}
            if not missing or len(batch) >= self.limit:
                break
            with trio.move_on_at(trio.current_time() + max(deadline - time.monotonic(), 0)) as scope:
                batch.append(await self._queue.receive())
            if scope.cancelled_caught:
                break
        self._learn(batch)
        return batch

    def _learn(self, batch: list[Round]) -> None:
        """How long the last batch's conversations took to send their next round: the next wait is twice that."""
        took = [r.queued - self.expected[r.s.sid] for r in batch if r.s.sid in self.expected]
        if took:
            self.gather_s = min(max(0.001, 2 * max(took)), MAX_GATHER_S)
