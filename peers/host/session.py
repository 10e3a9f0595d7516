"""A conversation as the ring sees it, and the rollback rule.

Every frame carries `committed`, the positions of the conversation that every stage keeps; a stage first trims
its cache to that many, then appends the frame's positions. So rolling back is setting a position (as in
Petals): nothing is sent to undo a rejected draft, and a failed or repeated pass is harmless. The positions are
valid for one plan (`epoch`); after a re-plan the conversation replays from position 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from peers.compute.shard import SessionCache


@dataclass
class RingSession:
    sid: str
    cache: SessionCache | None = None  # the host's own stage
    epoch: int = -1  # the plan the ring's caches were filled under; -1: unknown (replay)
    length: int = 0  # the conversation's committed tokens
    ring_len: int = 0  # how many of them every stage's cache holds: the next frame's `committed`
    filled: int = 0  # positions the last pass left in every stage's cache, its drafts included
    features: tuple[int, list[int], torch.Tensor] | None = None  # last pass: first position, ids, final features
    best: list[int] | None = None  # last pass: the argmax of each logits row (the target's greedy choices)

    def held(self, epoch: int) -> int:
        """Positions every stage still holds under plan `epoch`; 0 after a re-plan, a failed pass, or when the
        host's arena gave this conversation's row to another (peers/compute/kv.py)."""
        return self.ring_len if self.fresh(epoch) else 0

    def fresh(self, epoch: int) -> bool:
        """Whether every stage's cache still holds what this conversation's passes under plan `epoch` left."""
        return self.epoch == epoch and self.cache is not None and not self.cache.evicted

    def restart(self, epoch: int, cache: SessionCache) -> None:
        """Replay from position 0 under plan `epoch`, the host's stage on a fresh cache."""
        self.cache, self.epoch, self.ring_len, self.filled = cache, epoch, 0, 0

    def passed(self, first: int, n: int) -> None:
        """A pass fed positions [first, first + n): every stage now holds first + n, drafts included."""
        self.filled = first + n

    def lost(self) -> None:
        """A pass failed part way: what each stage holds is unknown, so the next pass replays."""
        self.epoch = -1

    def set_position(self, position: int, length: int) -> None:
        """The conversation is now `length` tokens long and every stage keeps its first `position`.

        The ring cannot keep more than it was fed, and it must lack at least the last token: the next pass feeds
        that token to read its logits. So 0 <= position <= filled and position < length."""
        if not (0 <= position <= self.filled and position < length):
            raise ValueError(f"ring position {position} is outside 0..min({self.filled}, {length - 1})")
        self.length, self.ring_len = length, position
