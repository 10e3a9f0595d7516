"""A model draft's trees (EAGLE-2's dynamic tree, peers/drafting/grow.py): the draft's own probabilities rank its
guesses, and each level of the tree is one forward of the draft over all the level's nodes, each at its depth and
seeing the context and its own ancestors only (peers/tree.py's mask). The draft's cache takes the tree's entries
while it grows and gives them back after: the ring's answer decides what the context becomes.

All it asks of the draft is `forward_nodes(ids, positions, mask)` (logits after each given token, its keys and
values appended to the cache) and `drop(n)` (forget the last n entries), on top of `sync(context)` (the cache
follows the context; the logits after its last token).
"""
from __future__ import annotations

import threading

import torch

from .. import tree
from ..sampling import SamplingParams, pad_vocab, position_generator
from ..tree import BRANCHES, Draft
from ..tree_sampling import sampled_children
from .grow import grow, run


def draft_tree(draft, context: list[int], floor: float, depth: int, max_nodes: int,
               stop: threading.Event | None, params: SamplingParams) -> Draft:
    """(on the draft's own thread) The tree of drafts after `context`."""
    logits = draft.sync(context)
    base = len(context)
    gen = None if params.greedy else position_generator(params.seed, base, stream=0)

    def children(row: torch.Tensor):
        if gen is None:
            p = torch.softmax(row.float(), -1)
            values, ids = p.topk(BRANCHES)
            return list(zip(ids.tolist(), values.tolist())), None
        q = pad_vocab(params.probs(row[None])[0], draft.target_vocab)
        return sampled_children(q, BRANCHES, gen), q

    grown = 0

    def expand(level, tokens, parents):
        nonlocal grown
        first = level[0]
        mask = tree.attention_mask(base, len(tokens), parents)[..., first:, :]
        pos = tree.positions(base, len(tokens), parents)[:, first:]
        rows = draft.forward_nodes([tokens[i] for i in level], pos, mask)
        grown += len(level)
        return [children(r) for r in rows]
        yield  # (a generator that never waits)

    try:
        return run(grow(children(logits), expand, floor, depth, max_nodes, stop))
    finally:
        draft.drop(grown)
