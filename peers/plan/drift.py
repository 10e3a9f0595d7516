"""Speeds that drift. A plan for speed is only as good as the speeds it was made with: another program that takes
a member's cores (or gives them back) moves its time per layer for as long as it runs. Every pass already says
what each member took (its trace), so each member's ms per layer is watched against its own baseline, the median
of its first passes under the plan. A member whose passes run FACTOR times slower or faster than that, pass
after pass for HOLD passes and HOLD_S seconds, has drifted: the host re-plans for speed between answers, with
the member's figure scaled by how far it moved. Hysteresis keeps a plan from flapping: the factor both ways, the
hold, a new baseline under every plan, and no re-plan for drift within COOLDOWN_S of the last. Pure; no torch.

Only rounds are compared (passes of at most SMALL positions): a prefill's time per position is another matter.
"""
from __future__ import annotations

import math
import statistics
from collections import deque

FACTOR = 1.8  # how far from its baseline a member's ms per layer must move
BASELINE = 8  # a member's first rounds under a plan, whose median is its baseline
HOLD, HOLD_S = 12, 10.0  # rounds in a row past the factor, and for at least this long
COOLDOWN_S = 60.0  # between two re-plans for drift
SMALL = 16  # positions a pass may carry to be compared


class Drift:
    def __init__(self, hold_s: float = HOLD_S, cooldown_s: float = COOLDOWN_S):
        """hold_s, cooldown_s: shorter in tests."""
        self.hold_s, self.cooldown_s = hold_s, cooldown_s
        self.last_replan = -math.inf
        self.reset()

    def reset(self) -> None:
        """A new plan: new baselines (a span of another size, other neighbours)."""
        self.first: dict[str, list[float]] = {}
        self.base: dict[str, float] = {}
        self.run: dict[str, deque] = {}  # the last rounds' ratios past the factor, in a row
        self.since: dict[str, float] = {}  # when that run began

    def observe(self, name: str, ms: float, layers: int, positions: int, now: float) -> None:
        """One pass's time on member `name`, which holds `layers` layers."""
        if layers <= 0 or positions > SMALL or ms <= 0:
            return
        per_layer = ms / layers
        if name not in self.base:
            first = self.first.setdefault(name, [])
            first.append(per_layer)
            if len(first) >= BASELINE:
                self.base[name] = statistics.median(first)
            return
        ratio = per_layer / self.base[name]
        if 1 / FACTOR < ratio < FACTOR:
            self.run.pop(name, None)
            self.since.pop(name, None)
            return
        run = self.run.setdefault(name, deque(maxlen=HOLD))
        if run and (run[-1] > 1) != (ratio > 1):  # the other way: a new run
            run.clear()
        if not run:
            self.since[name] = now
        run.append(ratio)

    def drifted(self, now: float) -> dict[str, float]:
        """The members that drifted, each with how far (its recent ms per layer over its baseline); none within
        COOLDOWN_S of the last re-plan for drift."""
        if now - self.last_replan < self.cooldown_s:
            return {}
        return {name: statistics.median(run) for name, run in self.run.items()
                if len(run) >= HOLD and now - self.since[name] >= self.hold_s}

    def replanned(self, now: float) -> None:
        self.last_replan = now
        self.reset()
