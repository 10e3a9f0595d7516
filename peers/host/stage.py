"""The host's own stage: its layers (the first span, with the embedding) before a pass goes round, and the final
norm and LM head after it comes back, each run on the process's device runtime (peers/compute/runtime.py) from one of
trio's worker threads, one at a time, finished on the device before it is timed: trio's thread never waits for
the device. The head goes first among what waits: an answer waits for its verdict, while the layers of a round
sent ahead (peers/speculation/in_flight.py) only keep the ring busy."""
from __future__ import annotations

import heapq
import itertools

import torch
import trio

from peers.compute import device
from peers.wire import tensors
from peers.compute.runtime import RUNTIME
from peers.compute.runtime import call_with_threads


class HostStage:
    def __init__(self, planner, device_name: str):
        self.planner, self.device = planner, device_name
        self.queue = UrgentFirst()
        self.threads = torch.get_num_threads()  # for the shard's compute, whatever a draft's thread has set

    async def _call(self, fn, *args, urgent: bool = False):
        await self.queue.take(urgent)
        try:
            return await trio.to_thread.run_sync(call_with_threads, self.threads, RUNTIME.call, self.device, fn,
                                                 *args)
        finally:
            self.queue.give_back()

    async def first(self, passes: list, pack: bool):
        """Each conversation's hidden states after the host's layers, and (pack) the frame's copy of all of them
        on the CPU."""
        return await self._call(self._first, passes, pack)

    def _first(self, passes: list, pack: bool):
        hs = self.planner.shard.forward(passes)
        out = tensors.host_bytes(torch.cat(hs, dim=1)) if pack else (None, None)
        device.finish(self.device)
        return hs, out

    async def head(self, passes: list[tuple[torch.Tensor, int]]) -> list:
        """Features, logits and each logits row's argmax (the target's greedy choice, taken where the logits
        are: only those ids come to the CPU) of each conversation's (hidden states [T, H], n_logits), the head
        run once over all of them."""
        return await self._call(self._head, passes, urgent=True)

    def _head(self, passes: list) -> list:
        shard = self.planner.shard
        outs = shard.finish([(h.to(self.device, non_blocking=True), n) for h, n in passes])
        best = [logits.argmax(-1) for _, logits in outs]
        if shard.device.type != "cpu":
            best = [torch.empty(b.shape, dtype=b.dtype, pin_memory=True).copy_(b, non_blocking=True) for b in best]
        device.finish(self.device)
        return [(feats, logits, b.tolist()) for (feats, logits), b in zip(outs, best)]


class UrgentFirst:
    """One computation at a time on the host's stage; an urgent one goes before the others waiting."""

    def __init__(self):
        self.busy = False
        self.waiting: list[tuple[int, int, trio.Event]] = []  # (0 urgent / 1 not, arrival, its turn) as a heap
        self.arrivals = itertools.count()

    async def take(self, urgent: bool) -> None:
        if not self.busy:
            self.busy = True
            return
        turn = (0 if urgent else 1, next(self.arrivals), trio.Event())
        heapq.heappush(self.waiting, turn)
        try:
            await turn[2].wait()
        except BaseException:  # cancelled: out of the queue, or (handed the turn as it was cancelled) pass it on
            if turn[2].is_set():
                self.give_back()
            else:
                self.waiting.remove(turn)
                heapq.heapify(self.waiting)
            raise

    def give_back(self) -> None:
        if self.waiting:
            heapq.heappop(self.waiting)[2].set()  # (still busy: the turn goes straight to the next)
        else:
            self.busy = False
