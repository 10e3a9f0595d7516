"""Prompt lookup: the drafts are what followed the latest earlier occurrence of the context's last few tokens.

As a tree: every continuation the conversation holds. A node's children are the tokens that followed the earlier
occurrences of its last few tokens (the longest that occurred), the latest occurrence's first, each with its
share of those occurrences times AGREE as its chance.
"""
from __future__ import annotations

import time

from peers.speculation.tree import Draft
from peers.speculation.drafting.base import Drafter
from peers.speculation.drafting.grow import grow, run

AGREE = 0.7  # how often the target goes on as the text did before: a prior that the policy's trust corrects


class NgramDrafter(Drafter):
    """Prompt lookup: find the latest earlier occurrence of the context's last few tokens, propose what followed."""

    name = "ngram"
    trees = True

    def __init__(self, max_ngram: int = 3, min_ngram: int = 2):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, context, n, params, stop=None, floor=0.0, prior=1.0):
        t0 = time.perf_counter()
        out = lookup(context, n, self.max_ngram, self.min_ngram)
        self._measure(time.perf_counter() - t0, max(len(out), 1))
        return out, None


    def propose_tree(self, context, floor, depth, max_nodes, stop=None, params=None) -> Draft:
        t0 = time.perf_counter()
        follow = continuations(context, self.max_ngram, self.min_ngram)
        tails = {-1: context[-self.max_ngram:]}

        def expand(level, tokens, parents):
            for i in level:
                tails[i] = (tails[parents[i]] + [tokens[i]])[-self.max_ngram:]
            return [(follow(tails[i]), None) for i in level]
            yield  # (a generator that never waits)

        d = run(grow((follow(tails[-1]), None), expand, floor, depth, max_nodes, stop))
        self._measure(time.perf_counter() - t0, max(len(d.tokens), 1))
        self.confidence = d.sure
        return d


def continuations(context: list[int], max_ngram: int = 3, min_ngram: int = 2):
    """tail -> what followed the earlier occurrences of its last max_ngram..min_ngram tokens (the longest that
    occurred) as [(token, chance)], the latest occurrence's token first. One pass over the context indexes them."""
    index: dict[tuple, list[int]] = {}
    for size in range(min_ngram, max_ngram + 1):
        for start in range(len(context) - size):
            index.setdefault(tuple(context[start : start + size]), []).append(context[start + size])

    def follow(tail: list[int]) -> list[tuple[int, float]]:
        for size in range(max_ngram, min_ngram - 1, -1):
            if len(tail) >= size and (after := index.get(tuple(tail[-size:]))):
                counts: dict[int, int] = {}
                for t in reversed(after):  # latest first
                    counts[t] = counts.get(t, 0) + 1
                return [(t, AGREE * n / len(after)) for t, n in counts.items()]
        return []
    return follow


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
