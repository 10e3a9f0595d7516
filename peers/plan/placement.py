"""Placement by measured speed: which members hold layers, how many, in which order. Pure; free of torch.

One conversation goes round the ring as a sequence: a token costs the sum over the stages of layers x ms per layer,
plus a hop to and from each stage that holds layers. The fastest members should so hold as many layers as they can
hold, and a member that only adds time should hold none (a spare). With many conversations in flight (serve),
the busiest stage bounds throughput instead: the plan then evens out each stage's layers x ms per layer.

Exact for a handful of members: every subset of the members beside the host is tried (the host always takes part:
it holds the embedding and the head), and for one subset the best counts are found greedily (the sequence: fill the
fastest first; the busiest stage: the least bound under which the subset holds every layer).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from itertools import combinations

PLACEMENTS = ("speed", "memory")
MAX_TRIED = 12  # members beside the host tried as every subset (4096 subsets); beyond, the fastest ones


def placement_of(name: str | None) -> str:
    """--placement, else $SFCHAT_PLACEMENT, else speed."""
    name = name or os.environ.get("SFCHAT_PLACEMENT") or "speed"
    if name not in PLACEMENTS:
        raise ValueError(f"unknown placement {name!r}: speed or memory")
    return name


@dataclass(frozen=True, slots=True)
class Stage:
    """One member as placement sees it: the host first."""

    cap: int  # the most layers it can hold (peers/plan/layers.py: capacities)
    ms_per_layer: float  # measured (peers/compute/speed.py), scaled to this model's layers
    link_ms: float = 0.0  # the round trip between the host and it (0 for the host)


def sequence_ms(stages: list[Stage], counts: list[int]) -> float:
    """Predicted ms per token for one conversation: every stage's layers x ms per layer, plus a round trip to
    each member that holds layers."""
    return sum(n * s.ms_per_layer + (s.link_ms if n else 0.0) for s, n in zip(stages, counts))


def busiest_ms(stages: list[Stage], counts: list[int]) -> float:
    """The busiest stage's time per pass (its layers and its link): what bounds many conversations in flight."""
    return max((n * s.ms_per_layer + (s.link_ms if n else 0.0) for s, n in zip(stages, counts)), default=0.0)


def _fill_fastest(stages: list[Stage], chosen: list[int], n_layers: int) -> list[int] | None:
    counts = [0] * len(stages)
    left = n_layers
    for i in sorted(chosen, key=lambda i: stages[i].ms_per_layer):
        counts[i] = min(stages[i].cap, left)
        left -= counts[i]
    return counts if left == 0 else None


def _even_out(stages: list[Stage], chosen: list[int], n_layers: int) -> list[int] | None:
    """The least bound T on a stage's time under which the chosen stages hold every layer, then the counts under it
    (the excess taken off the slowest stages, which lowers no stage above T)."""
    if sum(stages[i].cap for i in chosen) < n_layers:
        return None
    bounds = sorted({k * stages[i].ms_per_layer + stages[i].link_ms for i in chosen for k in range(1, stages[i].cap + 1)})

    def counts_under(t: float) -> list[int]:
        counts = [0] * len(stages)
        for i in chosen:
            s = stages[i]
            counts[i] = min(s.cap, math.floor((t - s.link_ms) / s.ms_per_layer + 1e-9)) if s.ms_per_layer > 0 else s.cap
            counts[i] = max(counts[i], 0)
        return counts

    lo, hi = 0, len(bounds) - 1
    while lo < hi:  # the first bound under which they hold every layer
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if sum(counts_under(bounds[mid])) >= n_layers else (mid + 1, hi)
    counts = counts_under(bounds[lo])
    for i in sorted(chosen, key=lambda i: -stages[i].ms_per_layer):
        cut = min(counts[i], sum(counts) - n_layers)
        counts[i] -= cut
    return counts


def place(stages: list[Stage], n_layers: int, *, many: bool = False,
          must: frozenset[int] = frozenset()) -> list[int] | None:
    """Layers per stage (the host first) minimizing the predicted ms per token for one conversation, or, `many`,
    the busiest stage (ties: the shorter sequence); the stages in `must` hold at least one layer each (processes
    the user asked for in the ring); None if the stages cannot hold the model."""
    if sum(s.cap for s in stages) < n_layers:
        return None
    others = sorted((i for i in range(1, len(stages)) if i not in must),
                    key=lambda i: stages[i].ms_per_layer)[:MAX_TRIED]
    best, best_key = None, None
    for k in range(len(others) + 1):
        for subset in combinations(others, k):
            chosen = [0, *sorted(must), *subset]
            counts = (_even_out if many else _fill_fastest)(stages, chosen, n_layers)
            if counts is None or not _hold_one_each(stages, counts, must):
                continue
            seq = sequence_ms(stages, counts)
            key = (busiest_ms(stages, counts), seq) if many else (seq,)
            if best_key is None or key < tuple(b - 1e-9 for b in best_key):
                best, best_key = counts, key
    return best


def _hold_one_each(stages: list[Stage], counts: list[int], must: frozenset[int]) -> bool:
    """A layer for each stage of `must` that got none, from the stage that holds the most (False: cannot)."""
    for i in must:
        if counts[i] == 0:
            if stages[i].cap < 1:
                return False
            counts[max(range(len(counts)), key=lambda j: counts[j])] -= 1
            counts[i] = 1
    return True


def ring_order(stages: list[Stage], counts: list[int]) -> list[int]:
    """The members that hold layers, in pass order after the host: the nearest first (the shortest hops lead;
    the stages hold contiguous layers in this order)."""
    return sorted((i for i in range(1, len(stages)) if counts[i]), key=lambda i: (stages[i].link_ms, i))
