"""Several conversations in one pass: their positions packed one after another into one sequence.

A decoder layer's matrices (q/k/v/o and the MLP) treat every position alike, so they run once over the packed
sequence and read the weights once for all conversations: on a decode pass that reading is most of the cost.
Only attention must keep conversations apart. Each one's keys and values go to its own row of the arena
(peers/compute/kv.py), and each one's queries attend to its own row under its own mask. The layers pass what the cache returns and the
mask they are given straight to the attention function, so a `Packed` list travels through them untouched, and
`attention` below, registered with transformers, splits the queries by segment and calls the family's own
attention on each. A draft's conversations keep transformers' own caches: `Caches` hands each its segment.
"""
from __future__ import annotations

import sys

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from peers.compute import invariant

NAME = "sfchat_packed"


class Packed(list):
    """Per-segment keys, values or masks, in segment order; `bounds`: each segment's [start, end) in the pass."""

    def __init__(self, parts, bounds: list[tuple[int, int]]):
        super().__init__(parts)
        self.bounds = bounds


class Caches:
    """As kv.ArenaWriter, for conversations whose caches are transformers' own (a draft's): each segment's keys
    and values go to its conversation's cache, which returns all of that conversation's."""

    def __init__(self, caches: list, bounds: list[tuple[int, int]]):
        self.caches, self.bounds = caches, bounds

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        parts = [c.update(key_states[:, :, a:b], value_states[:, :, a:b], layer_idx)
                 for c, (a, b) in zip(self.caches, self.bounds)]
        return Packed([k for k, _ in parts], self.bounds), Packed([v for _, v in parts], self.bounds)


class PackedWriter:
    """The cache transformers' attention layers call during an eager pass: `update` writes each segment's keys and
    values into its conversation's row of the arena (peers/compute/kv.py) at its cache columns and returns, per segment,
    the columns its mask covers; or, with `plans` (peers/compute/invariant.py: each segment's query groups), the
    whole row, which `attention` then reads group by group."""

    def __init__(self, arena, rows: list[int], first_layer: int, indices: list[torch.Tensor], views: list[dict] | None,
                 bounds: list[tuple[int, int]], plans: list | None = None):
        self.arena, self.rows, self.first = arena, rows, first_layer
        self.indices, self.views, self.bounds, self.plans = indices, views, bounds, plans

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        keys, values = [], []
        layer = layer_idx - self.first
        for i, (row, index, (a, b)) in enumerate(zip(self.rows, self.indices, self.bounds)):
            k, v = self.arena.keys[layer, row : row + 1], self.arena.values[layer, row : row + 1]
            k.index_copy_(2, index, key_states[:, :, a:b])
            v.index_copy_(2, index, value_states[:, :, a:b])
            lo, hi = self.views[i][layer_idx] if self.plans is None else (0, k.shape[2])
            keys.append(k[:, :, lo:hi])
            values.append(v[:, :, lo:hi])
        keys, values = Packed(keys, self.bounds), Packed(values, self.bounds)
        keys.plans = self.plans
        return keys, values


def attention(module, query, key, value, attention_mask, **kwargs):
    """The family's own attention (`module.sfchat_attention`: sdpa, or the model's eager one), per segment when the
    pass is packed, else as it is."""
    if getattr(key, "plans", None) is not None:  # rows computed as a one-token pass would (invariant.py)
        outs = [invariant.attend(query[:, :, a:b], k, v, plan, kwargs["scaling"], kwargs.get("sliding_window"))
                for (a, b), k, v, plan in zip(key.bounds, key, value, key.plans)]
        return torch.cat(outs, dim=1), None
    inner = family_attention(module)
    if not isinstance(key, Packed):
        return inner(module, query, key, value, attention_mask, **kwargs)
    outs = [inner(module, query[:, :, a:b], k, v, m, **kwargs)[0]
            for (a, b), k, v, m in zip(key.bounds, key, value, attention_mask)]
    return torch.cat(outs, dim=1), None  # [1, positions, heads, head_dim], as the attention functions return it


def family_attention(module):
    name = module.config.sfchat_attention
    if name == "eager":  # each model's own eager attention (Gemma 2's soft-caps its logits)
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[name]


def family_mask(*args, config, **kwargs):
    """The mask the family's own attention takes, for a routed model that runs its own forward (a draft's
    single conversation): everything but a packed pass is as it was."""
    return ALL_MASK_ATTENTION_FUNCTIONS[config.sfchat_attention](*args, config=config, **kwargs)


def route(config) -> None:
    """Send a model's attention through `attention` (its own kind kept in config.sfchat_attention)."""
    if config._attn_implementation != NAME:
        config.sfchat_attention = config._attn_implementation
        config._attn_implementation = NAME


AttentionInterface.register(NAME, attention)
AttentionMaskInterface.register(NAME, family_mask)
