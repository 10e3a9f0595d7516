"""Growing a tree of drafts (EAGLE-2's dynamic tree) from any drafter that can rank its guesses at a node.

A level at a time: each frontier node's candidate children come with their chances (the node's chance times the
child's own probability under the draft; in a sampled round the j-th largest probability of the node's q, which
does not depend on the token drawn: peers/speculation/tree_sampling.py). A candidate is kept if its chance is at least the
floor and fewer than max_nodes nodes are likelier (what the final cut to the max_nodes likeliest keeps anyway:
a node is never likelier than its parent, so nothing deeper can overtake it). Then the drafter expands the new
level's nodes together (a model draft: one forward over all of them, each seeing its ancestors). The result is
the max_nodes likeliest nodes in peers/speculation/tree.py's layout.

`expand(level, tokens, parents)` is a generator (so that a drafter that drafts several conversations together
can interleave its forwards: peers/speculation/drafting/together.py); it returns, for each node of the level, its children
[(token, chance)], likeliest or first drawn first, and (sampled) the distribution q they were drawn from.
"""
from __future__ import annotations

import threading

import torch

from peers.speculation.tree import Draft, depth_first

Children = tuple[list[tuple[int, float]], torch.Tensor | None]


def grow(root: Children, expand, floor: float, depth: int, max_nodes: int, stop: threading.Event | None = None):
    """(generator) The tree: a Draft (q: each node's parent's distribution, where the children were sampled)."""
    tokens, parents, sure, rows = [], [], [], []
    kids: dict[int, Children] = {-1: root}
    level = [-1]
    for _ in range(depth):
        ranked = sorted(sure, reverse=True)
        candidates = sorted(((-(sure[p] if p >= 0 else 1.0) * c, k, j, p, t) for k, p in enumerate(level)
                             for j, (t, c) in enumerate(kids[p][0])))
        new = []
        for neg, _, _, p, t in candidates:
            chance = -neg
            likelier = len(ranked) - _count_below(ranked, chance) + len(new)
            if chance < floor or likelier >= max_nodes:
                break
            new.append((chance, p, t))
        if not new or (stop is not None and stop.is_set()):
            break
        first = len(tokens)
        for chance, p, t in new:
            tokens.append(t)
            parents.append(p)
            sure.append(chance)
            rows.append(kids[p][1])
        level = list(range(first, len(tokens)))
        for i, c in zip(level, (yield from expand(level, tokens, parents))):
            kids[i] = c
    d, order = depth_first(tokens, parents, sure, {i: c[0][0][0] for i, c in kids.items() if c[0]})
    if rows and rows[0] is not None:
        d.q = torch.stack([rows[i] for i in order])
    return d.likeliest(max_nodes) if len(d.tokens) > max_nodes else d


def _count_below(ranked_desc: list[float], chance: float) -> int:
    """How many of these chances (largest first) are below `chance`."""
    n = 0
    for s in reversed(ranked_desc):
        if s >= chance:
            break
        n += 1
    return n


def run(steps):
    """A generator that yields nothing (a drafter that drafts alone) run to its result."""
    try:
        while True:
            next(steps)
    except StopIteration as done:
        return done.value
