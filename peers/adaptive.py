"""Adaptive draft length: pick K to maximise expected tokens per second.

With per-token acceptance alpha, a round with K drafts commits on average
    E(K) = (1 - alpha^(K+1)) / (1 - alpha)
tokens (the accepted prefix plus the target's own next token), and costs about
    round_ms + K * draft_ms
so we pick argmax_K E(K) / (round_ms + K * draft_ms). alpha is a moving average of accepted / drafted.
"""
from __future__ import annotations

from dataclasses import dataclass


def expected_tokens(alpha: float, k: int) -> float:
    if alpha >= 1.0:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def best_k(alpha: float, round_ms: float, draft_ms: float, k_max: int) -> int:
    return max(range(k_max + 1), key=lambda k: expected_tokens(alpha, k) / (round_ms + k * draft_ms + 1e-9))


@dataclass
class KPolicy:
    pinned: int | None = None  # --k N
    k_max: int = 12
    alpha: float = 0.6  # prior, replaced by measurements within a few rounds
    round_ms: float = 0.0
    smoothing: float = 0.3

    def choose(self, draft_ms: float) -> int:
        if self.pinned is not None:
            return self.pinned
        if self.round_ms <= 0:
            return 4
        # at least one draft, or a drafter that once missed would never be measured again
        return max(1, best_k(self.alpha, self.round_ms, draft_ms, self.k_max))

    def update(self, drafted: int, accepted: int, round_ms: float) -> None:
        a = self.smoothing
        if drafted:
            self.alpha = (1 - a) * self.alpha + a * min(accepted / drafted, 0.99)
        self.round_ms = round_ms if self.round_ms <= 0 else (1 - a) * self.round_ms + a * round_ms
