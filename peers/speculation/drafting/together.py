"""Conversations drafting at the same time draft together: one forward of the draft per step for all of them.

The host's batcher (peers/host/batcher.py) sends the rounds of many conversations in one pass, so their answers come
back at the same moment and they all draft their next round (and, while a pass is on the wire, their
look-aheads) at once. Drafting one after another, each forward reads the draft's weights again and pays its
fixed cost again; here each conversation's drafting is a generator of steps (FeatureDrafter.chain_steps and
tree_steps: each yields the forward it needs next and is sent its output), and all that are waiting advance in
lockstep, their steps packed into one forward (FeatureDraft.forward_many). A chain of 3 next to a tree of 5
levels: the chain leaves after its third step, the tree goes on alone.

Who waits for whom: the first request gathers the others for a moment. The drafters that drafted in the last
run are expected again; it waits until they have all come, or for twice the spread of arrivals it has seen
(at most MAX_GATHER_S), so a conversation that needs no draft this round holds the others up only that long.
One task leads each run, on a worker thread; a cancelled request leaves the queue and the run goes on without it.
"""
from __future__ import annotations

import logging
import time
import weakref
from functools import partial
from dataclasses import dataclass, field

import torch
import trio

from peers.base.window import GatherWindow
from peers.compute.runtime import DRAFT, RUNTIME, torch_threads

log = logging.getLogger("peers.drafting")
MAX_GATHER_S = 0.01


@dataclass
class Request:
    drafter: object
    steps: object  # a generator of steps
    arrived: float = field(default_factory=time.monotonic)
    done: bool = False
    result: object = None
    error: BaseException | None = None


class Together:
    """forward_many(steps) -> each step's output; run(drafter, steps) drives `steps` to its end with the steps of
    whoever else drafts at the same time, and returns its result."""

    def __init__(self, forward_many, threads: int = 1, device: str = "cpu"):
        """threads: the CPU threads its forwards take (a feature draft's matrices are small: one). device: where
        they run (a GPU's work goes to the process's device runtime, peers/compute/runtime.py)."""
        self.forward_many, self.threads, self.device = forward_many, threads, device
        self.pending: list[Request] = []
        self.leading = False
        self.expected = weakref.WeakSet()  # the drafters of the last run: they come again, soon
        self.window = GatherWindow(0.0005, MAX_GATHER_S, 0.001)
        self._arrival, self._finished = trio.Event(), trio.Event()
        self.runs = self.requests = 0  # for the statistics

    def forget(self, drafter) -> None:
        """A conversation that ended: nobody waits for it."""
        self.expected.discard(drafter)

    async def run(self, drafter, steps):
        r = Request(drafter, steps)
        self.pending.append(r)
        self._arrival.set()
        try:
            while not r.done:
                if not self.leading:
                    await self._lead()
                else:
                    await self._finished.wait()
        finally:
            if r in self.pending:  # cancelled before its run
                self.pending.remove(r)
        if r.error is not None:
            raise r.error
        return r.result

    async def _lead(self) -> None:
        self.leading = True
        try:
            await self._gather()
            batch, self.pending = self.pending, []
            if batch:
                with trio.CancelScope(shield=True):  # the others' drafts are in this run too
                    try:
                        await trio.to_thread.run_sync(partial(RUNTIME.call, self.device, self._drive, batch,
                                                              lane=DRAFT))
                    except Exception as e:  # (a bug) the run's requests fail, nobody waits for them
                        for r in batch:
                            if not r.done:
                                r.error, r.done = e, True
                self._learn(batch)
        finally:
            self.leading = False
            self._finished.set()
            self._finished = trio.Event()

    async def _gather(self) -> None:
        await trio.sleep(0)  # those woken at this same moment (by one pass's reply) come first
        deadline = min(r.arrived for r in self.pending) + self.window.s if self.pending else 0.0
        while (now := time.monotonic()) < deadline and not self._all_here():
            self._arrival = trio.Event()
            with trio.move_on_after(deadline - now):
                await self._arrival.wait()

    def _all_here(self) -> bool:
        here = {id(r.drafter) for r in self.pending}
        return all(id(d) in here for d in self.expected)

    def _learn(self, batch: list[Request]) -> None:
        self.runs += 1
        self.requests += len(batch)
        self.expected = weakref.WeakSet(r.drafter for r in batch)
        self.window.learn(max(r.arrived for r in batch) - min(r.arrived for r in batch))

    @torch.inference_mode()
    def _drive(self, batch: list[Request]) -> None:
        """(worker thread) Every request's steps in lockstep, each step of all of them in one forward."""
        with torch_threads(self.threads):
            locks = list({id(r.drafter.lock): r.drafter.lock for r in batch}.values())  # (each once)
            for lock in locks:
                lock.acquire()
            try:
                for r in batch:
                    r.drafter.share = 1 / len(batch)
                self._lockstep(batch)
            finally:
                for r in batch:
                    r.drafter.share = 1.0
                for lock in locks:
                    lock.release()

    def _lockstep(self, batch: list[Request]) -> None:
        outs: dict[int, tuple | None] = {id(r): None for r in batch}  # what each one's last step gave
        live = list(batch)
        while live:
            steps = []
            for r in live:
                try:
                    steps.append((r, r.steps.send(outs[id(r)])))
                except StopIteration as end:
                    r.result, r.done = end.value, True
                except Exception as e:  # this conversation's draft fails, not the others'
                    r.error, r.done = e, True
            live = []
            for (r, step), out in zip(steps, self._forward(steps)):
                if isinstance(out, Exception):
                    r.error, r.done = out, True
                    r.drafter._crop(0)  # its draft cache starts again from the next pass's features
                else:
                    outs[id(r)] = out
                    live.append(r)

    def _forward(self, steps: list) -> list:
        """Each (request, step)'s output, in one forward; where that fails, each step alone (after undoing what
        the failed forward wrote to the caches), so that a bad step fails only its own conversation's draft."""
        before = [step.cache.get_seq_length() for _, step in steps]
        if len(steps) > 1:
            try:
                return self.forward_many([step for _, step in steps])
            except Exception as e:
                log.warning("drafting %d conversations in one forward failed (%s: %s); each drafts this step alone",
                            len(steps), type(e).__name__, e)
                for (_, step), n in zip(steps, before):
                    rewind(step.cache, n)
        outs = []
        for (r, step), n in zip(steps, before):
            try:
                outs.append(r.drafter._run(step))
            except Exception as e:
                rewind(step.cache, n)
                outs.append(e)
        return outs


def rewind(cache, n: int) -> None:
    """Back to n positions, what a failed forward found (transformers' caches crop by a negative count)."""
    extra = cache.get_seq_length() - n
    if extra > 0:
        cache.crop(-extra)
