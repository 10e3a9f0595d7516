"""Prompt lookup: the drafts are what followed the latest earlier occurrence of the context's last few tokens."""
from __future__ import annotations

import time

from .base import Drafter


class NgramDrafter(Drafter):
    """Prompt lookup: find the latest earlier occurrence of the context's last few tokens, propose what followed."""

    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 2):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, context, n, params, stop=None, floor=0.0, prior=1.0):
        t0 = time.perf_counter()
        out = lookup(context, n, self.max_ngram, self.min_ngram)
        self._measure(time.perf_counter() - t0, max(len(out), 1))
        return out, None


def lookup(context: list[int], n: int, max_ngram: int = 3, min_ngram: int = 2) -> list[int]:
    if n <= 0:
        return []
    for size in range(max_ngram, min_ngram - 1, -1):
        if len(context) <= size:
            continue
        tail = context[-size:]
        for start in range(len(context) - size - 1, -1, -1):
            if context[start : start + size] == tail:
                follow = context[start + size : start + size + n]
                if follow:
                    return follow
    return []


def followers(context: list[int], max_ngram: int = 3, min_ngram: int = 2):
    """lookup's first token for any tail at once: one pass over the context indexes what followed each n-gram's
    latest occurrence; returns tail -> that token, or None. (For a tree of drafts: one index for every node.)"""
    index = {}
    for size in range(min_ngram, max_ngram + 1):
        for start in range(len(context) - size):
            index[tuple(context[start : start + size])] = context[start + size]

    def follow(tail: list[int]) -> int | None:
        for size in range(max_ngram, min_ngram - 1, -1):
            if len(tail) >= size and (t := index.get(tuple(tail[-size:]))) is not None:
                return t
        return None
    return follow
