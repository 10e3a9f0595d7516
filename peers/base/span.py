"""A contiguous range of decoder layers."""
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
