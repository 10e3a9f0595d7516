"""Speeds checked once placed. A member times a reference layer as it joins (peers/compute/speed.py), in a moment
that may not be like the ring's: a process on one thread can find a core free then and share it later. The ring's
own passes say what its layers really take, so after each stage's first rounds under a plan its ms per layer (their
median) is set against the figure the plan was made with.

An offset that hits every stage alike (the model's layers against the reference layer, a round's size) is no news:
where the host holds layers too, a member's ratio is taken over the host's, in the same rounds. Where the host holds
none there is no such yardstick, and only rounds no larger than the reference's pass count (a smaller round takes
less a layer, never more). Only a stage slower than its figure is judged: a stage's costs outside its layers (the
host's embedding and frames, a member's own) only ever add, so they can make a member look faster than it is, and a
figure too slow costs at most the layers a member could have held.

A stage slower by FACTOR, by at least SHARE of the predicted time per token, has its figure replaced by what its
passes showed, and the host re-plans for speed once, between answers. Each stage is corrected once while it is in
the ring (a member that joins again offers a new figure); what changes later is drift's (peers/plan/drift.py). Pure;
no torch.
"""
from __future__ import annotations

import statistics

from peers.base.limits import SPEED_POSITIONS
from peers.plan.drift import SMALL

FACTOR = 1.5  # how much slower than its figure a stage's passes must be
SHARE = 0.1  # and by how much of the predicted ms per token: a few layers' own overheads are not a wrong figure
ROUNDS = 8  # a stage's first rounds under a plan, whose median is set against its figure
HOST = "host"  # the host's own stage (as SFCHAT_TEST_MS_PER_LAYER names it)
REFERENCE = SPEED_POSITIONS[1]  # the positions of the pass the figures were timed at


class Calibration:
    def __init__(self):
        self.corrected: set[str] = set()  # stages whose figure was replaced: not again while they stay
        self.planned({})

    def planned(self, predicted: dict[str, tuple[int, float]], present=None) -> None:
        """A new plan: each stage that holds layers, with how many and the ms per layer the plan assumed.
        `present`: every stage in the ring now (one that left and comes back is judged by its new figure)."""
        self.predicted = {name: (n, ms) for name, (n, ms) in predicted.items() if n > 0 and ms > 0}
        self.relative = HOST in self.predicted and len(self.predicted) > 1
        self.seen: dict[str, list[float]] = {}
        if present is not None:
            self.corrected &= set(present)

    def observe(self, name: str, ms: float, positions: int) -> None:
        """One round's time on stage `name` (its layers, not the links)."""
        if name in self.predicted and ms > 0 and positions <= (SMALL if self.relative else REFERENCE):
            seen = self.seen.setdefault(name, [])
            if len(seen) < ROUNDS:
                seen.append(ms / self.predicted[name][0])

    def off(self) -> dict[str, float]:
        """The stages whose figure is wrong, each with the factor it is off by (the ms per layer its passes took
        over the plan's figure, over the host's own such ratio where there is one). Empty until every stage that
        holds layers has its rounds."""
        if not self.predicted or any(len(self.seen.get(name, ())) < ROUNDS for name in self.predicted):
            return {}
        ratio = {name: statistics.median(self.seen[name]) / ms for name, (_, ms) in self.predicted.items()}
        yardstick = ratio[HOST] if self.relative else 1.0
        total = sum(n * ms for n, ms in self.predicted.values())
        out = {}
        for name, (n, ms) in self.predicted.items():
            x = ratio[name] / yardstick
            if name in self.corrected or (self.relative and name == HOST):
                continue
            if x >= FACTOR and (x - 1) * n * ms >= SHARE * total:
                out[name] = x
        return out

    def correct(self, names) -> None:
        """These stages' figures were replaced: a re-plan follows, with new rounds to watch."""
        self.corrected |= set(names)
        self.planned({})
