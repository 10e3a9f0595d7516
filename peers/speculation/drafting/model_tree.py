"""A model draft's trees (EAGLE-2's dynamic tree, peers/speculation/drafting/grow.py): the draft's own probabilities rank its
guesses, and each level of the tree is one forward of the draft over all the level's nodes, each at its depth and
seeing the context and its own ancestors only (peers/speculation/tree.py's mask). The draft's cache takes the tree's entries
while it grows and gives them back after: the ring's answer decides what the context becomes.

All it asks of the draft is `sync(context)` (the cache follows the context; the logits after its last token),
`forward_nodes(tokens, parents, n)` (the logits after each of the last n nodes of the tree so far, each node seeing
the context and its own ancestors) and `room` (the positions the context and the tree may take: the draft's own
context, which may be shorter than the target's).
"""
from __future__ import annotations

import threading

import torch

from peers.speculation.sampling import SamplingParams, pad_vocab, position_generator
from peers.speculation.tree import BRANCHES, Draft
from peers.speculation.tree_sampling import coupled_children
from peers.speculation.drafting.grow import grow, run


def draft_tree(draft, context: list[int], floor: float, depth: int, max_nodes: int,
               stop: threading.Event | None, params: SamplingParams) -> Draft:
    """(on the draft's own thread) The tree of drafts after `context`; none past the draft's room, and a tree
    that stops growing where its next level would not fit it (the ring then verifies what there is, or runs a
    plain round)."""
    if len(context) > draft.room:
        return Draft()
    logits = draft.sync(context)
    base = len(context)
    gen = None if params.greedy else position_generator(params.seed, base, stream=0)

    below = {-1: 0}  # each node's depth: its children are at position base + that

    def children(row: torch.Tensor, node: int = -1):
        if gen is None:
            p = torch.softmax(row.float(), -1)
            values, ids = p.topk(BRANCHES)
            return list(zip(ids.tolist(), values.tolist())), None
        q = pad_vocab(params.probs(row[None])[0], draft.target_vocab)
        return coupled_children(q, BRANCHES, gen, params.seed, base + below[node]), q

    def expand(level, tokens, parents):
        if base + len(tokens) > draft.room:  # (the whole tree so far goes after the context) no children
            return [([], None) for _ in level]
        rows = draft.forward_nodes(list(tokens), list(parents), len(level))
        for i in level:
            below[i] = below[parents[i]] + 1
        return [children(r, i) for r, i in zip(rows, level)]
        yield  # (a generator that never waits)

    return run(grow(children(logits), expand, floor, depth, max_nodes, stop))
