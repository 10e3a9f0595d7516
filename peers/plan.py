"""Split a model's decoder layers over the ring's members in proportion to the memory each offers."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Span:
    """Layers [start, end) of a model with n_layers decoder layers."""

    start: int
    end: int
    n_layers: int

    def __post_init__(self):
        if not 0 <= self.start <= self.end <= self.n_layers:
            raise ValueError(f"bad layer span {self.start}..{self.end} of {self.n_layers}")

    @property
    def size(self) -> int:
        return self.end - self.start

    def __str__(self) -> str:
        return f"{self.start}-{self.end - 1}" if self.size else "none"


def split_layers(n_layers: int, offers: list[float]) -> list[Span]:
    """Contiguous spans, member i getting about n_layers * offer_i / sum(offers) layers (largest remainder).

    Member 0 is the host and comes first in the ring; a member offering nothing gets an empty span.
    """
    if not offers or any(o < 0 for o in offers):
        raise ValueError("offers must be non-negative")
    total = sum(offers)
    if total <= 0:
        offers, total = [1.0] * len(offers), float(len(offers))
    exact = [n_layers * o / total for o in offers]
    counts = [int(e) for e in exact]
    by_remainder = sorted(range(len(offers)), key=lambda i: (exact[i] - counts[i], offers[i]), reverse=True)
    for i in by_remainder[: n_layers - sum(counts)]:
        counts[i] += 1
    spans, start = [], 0
    for c in counts:
        spans.append(Span(start, start + c, n_layers))
        start += c
    return spans
