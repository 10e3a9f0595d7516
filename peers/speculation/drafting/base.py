"""The drafter protocol: a drafter proposes the next tokens cheaply on the host; the ring verifies them in one pass.

One interface: propose(context, n, params, stop) -> (tokens, q), q being the probabilities each token was
drawn from ([n, vocab]) or None when the proposal is deterministic (greedy or lookup: q is one-hot).
A sampled draft token at position i uses a generator seeded by (seed, i), so a seeded run is reproducible
however many tokens were drafted ahead while a round was on the wire.
"""
from __future__ import annotations

import copy
import threading
from functools import partial

import torch
import trio

from peers.speculation.sampling import SamplingParams


def common_prefix(a: list, b: list, limit: int | None = None) -> int:
    """How many leading items a and b share (at most `limit`). Called every round on the whole conversation: the
    usual case, all equal, is one list comparison in C; only a difference is searched item by item."""
    n = min(len(a), len(b)) if limit is None else min(len(a), len(b), limit)
    if a[:n] == b[:n]:
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


class Drafter:
    name = "none"
    ms_per_token = 0.0  # measured cost of one drafted token more (moving average)
    tokens_made, ms_spent = 0, 0.0  # every token proposed and the time it took, for measurements
    confident = False  # True: propose() honours floor and reports self.confidence
    trees = False  # True: it also has propose_tree(context, floor, depth, max_nodes, stop, params): a tree of
    # drafts (peers/speculation/tree.py), each node with its chance; sampled, its children drawn without replacement
    # (peers/speculation/tree_sampling.py)
    confidence: tuple[float, ...] | list[float] = ()
    share = 1.0  # the part of a call's time that was this drafter's (1/B when B conversations drafted together)

    def propose(self, context: list[int], n: int, params: SamplingParams, stop: threading.Event | None = None,
                floor: float = 0.0, prior: float = 1.0) -> tuple[list[int], torch.Tensor | None]:
        """Up to n tokens. A confident drafter also sets self.confidence: for each token, its chance (by its own
        reckoning) that the target accepts it and every draft before it, times `prior` (the chance of the drafts
        this call continues); it stops after the first token whose chance falls below `floor`."""
        return [], None

    async def draft(self, context: list[int], n: int, params: SamplingParams, stop: threading.Event | None = None,
                    floor: float = 0.0, prior: float = 1.0) -> tuple[list[int], torch.Tensor | None]:
        """propose, off the event loop (a drafter that drafts several conversations together overrides it)."""
        return await trio.to_thread.run_sync(partial(self.propose, context, n, params, stop, floor, prior))

    async def draft_tree(self, context: list[int], floor: float, depth: int, max_nodes: int,
                         stop: threading.Event | None = None, params: SamplingParams | None = None):
        """propose_tree (a drafter with trees has it), off the event loop."""
        return await trio.to_thread.run_sync(self.propose_tree, context, floor, depth, max_nodes, stop,
                                             params or SamplingParams())

    def _drive(self, steps):
        """Run a generator of steps (each yields a step and is sent `_run`'s output for it) to its end, alone; its
        result. Together with other conversations' steps, peers/speculation/drafting/together.py drives them."""
        out = None
        while True:
            try:
                step = steps.send(out)
            except StopIteration as done:
                return done.value
            out = self._run(step)

    def fork(self) -> "Drafter":
        """A drafter for another conversation running at the same time: the same weights, its own state."""
        return copy.copy(self)

    def close(self) -> None:
        """Give back what it holds beyond its weights (threads, compiled graphs) once nobody drafts with it."""

    def observe(self, start: int, ids: list[int], feats: torch.Tensor) -> None:
        """After a ring pass: the tokens at positions start.. and the target's final hidden states there (for
        drafts that read them; some of those tokens may be drafts the target went on to reject)."""

    def _measure(self, seconds: float, n: int, fixed: float = 0.0) -> None:
        """A call made n tokens in `seconds`, `fixed` of which it pays whatever n is (catching up on the context):
        ms_per_token is what one token more costs, the policy's draft_ms."""
        seconds, fixed = seconds * self.share, fixed * self.share
        if n:
            ms = (seconds - fixed) * 1e3 / n
            self.ms_per_token = ms if not self.ms_per_token else 0.8 * self.ms_per_token + 0.2 * ms
            self.tokens_made += n
            self.ms_spent += seconds * 1e3
