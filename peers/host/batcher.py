"""Many conversations in one pass: the host gathers the rounds that are ready and sends them round as one frame.

Each conversation has at most one round waiting (its answer waits for its pass). A batch takes every round that
is ready, and waits a little (about twice the time they have been taking, at most MAX_GATHER_S) for those of
conversations whose last round just came back and who are drafting their next: so conversations stay in step,
none runs more than one pass behind another, and the weights are read once per pass for all of them. A batch
goes out as soon as it is formed, even while an earlier one is on the wire, so a slow link is shared too, up to
one batch in flight per separate compute device in the ring (`in_flight`): with three GPUs, three batches keep
each one busy; where the stages share one machine's cores, two batches of four cost about twice what one batch
of eight costs (a pass over several positions reads the weights once) and the ring gains nothing by it. A
conversation that joins, or one that comes late, goes in the next batch.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import trio

from peers.base.window import GatherWindow

MAX_BATCH = 16  # rounds in one pass (sfchat serve's --max-conversations bounds the conversations first)
MAX_GATHER_S = 0.05


class Replay(Exception):
    """(a round's error) A re-plan came between its submission and its batch: its conversation replays, in chunks
    that take turns with the other conversations' rounds (peers/host/turns.py), so not inside a batch, which
    holds the ring's one pass in flight on a machine of shared cores."""


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
    # a round in flight (peers/speculation/in_flight.py) names its frame itself: the positions every stage keeps (`committed`
    # and the columns `keep`), its rows `tokens`, and `parents` over kept and new positions alike; None: the
    # host works them out from the conversation (tokens the ring lacks, then the drafts)
    committed: int | None = None
    keep: list[int] | None = None
    seq: int | None = None  # the frame that carried it, once sent (what a cancel names)


class Batcher:
    """`run_batch(rounds)` computes one batch and sets each round's result or error. Batches go out as they form:
    while one is on the wire the next may follow it (the members work on one while another travels)."""

    def __init__(self, run_batch, limit: int = MAX_BATCH, in_flight=lambda: 1):
        self.run_batch, self.limit, self.in_flight = run_batch, limit, in_flight
        self.flying, self._landed = 0, trio.Event()
        self._send, self._queue = trio.open_memory_channel(math.inf)
        self.back: dict[str, float] = {}  # conversation -> when its last round came back: its next one is due
        self.window = GatherWindow(0.001, MAX_GATHER_S, 0.005)  # conversations' next rounds come back this close
        self.batches = 0  # passes sent, for the statistics
        self.rounds = 0

    async def submit(self, r: Round) -> tuple:
        self._send.send_nowait(r)
        await r.done.wait()
        if r.error is not None:
            raise r.error
        return r.result

    def forget(self, sid: str) -> None:
        """A conversation that ended: no batch waits for it."""
        self.back.pop(sid, None)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                while self.flying >= max(1, self.in_flight()):
                    await self._landed.wait()
                batch = await self._gather()
                self.batches += 1
                self.rounds += len(batch)
                self.flying += 1
                nursery.start_soon(self._one, batch)

    async def _one(self, batch: list[Round]) -> None:
        try:
            await self.run_batch(batch)
        except Exception as e:  # every round of it fails alike
            for r in batch:
                if r.result is None and r.error is None:
                    r.error = e
        now = time.monotonic()
        for r in batch:
            self.back[r.s.sid] = now
            r.done.set()
        self.flying -= 1
        self._landed.set()
        self._landed = trio.Event()

    async def _gather(self) -> list[Round]:
        """The rounds ready now, and those of conversations whose last round just came back (they are drafting
        their next), waited for a little."""
        batch = [await self._queue.receive()]
        deadline = time.monotonic() + self.window.s
        while len(batch) < self.limit:
            while len(batch) < self.limit:
                try:
                    batch.append(self._queue.receive_nowait())
                except trio.WouldBlock:
                    break
            now = time.monotonic()
            here = {r.s.sid for r in batch}
            due = [sid for sid, t in self.back.items() if now - t < MAX_GATHER_S and sid not in here]
            if not due or now >= deadline or len(batch) >= self.limit:
                break
            with trio.move_on_after(deadline - now) as scope:
                batch.append(await self._queue.receive())
            if scope.cancelled_caught:
                break
        self._learn(batch)
        return batch

    def _learn(self, batch: list[Round]) -> None:
        """How long conversations took to send their next round once the last came back: the next wait is twice
        that."""
        took = [r.queued - self.back.pop(r.s.sid) for r in batch if r.s.sid in self.back]
        if took:
            self.window.learn(max(took))
