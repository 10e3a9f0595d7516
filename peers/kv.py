"""One conversation's keys and values on one member, in static buffers that every pass writes in place.

A slot holds two tensors [layers, 1, kv_heads, capacity, head_dim] for the shard's layers (the 1 is a batch row:
several conversations in one pass would be rows here). A pass writes its keys and values at cache indices
committed..committed+T-1 with index_copy_, and attention reads the columns a mask allows. The rollback rule is
setting `length`: what lies past it is overwritten by the next pass; nothing is cropped or concatenated.

Sliding-window layers keep every position too (the mask applies the window), so a rollback never needs states a
window dropped. Capacity grows in blocks (peers/plan.py counts the largest), so a short chat holds little; CUDA
graphs captured over a slot's buffers (peers/graphs.py) are dropped when they grow.

Everything a pass needs besides its input travels in one small tensor (`meta`: committed, each row's position,
which rows of the pass each row sees); masks, cache indices and rotary embeddings are computed from it on the
device, so a captured graph reads the next pass's values from the same buffer.
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field

import torch

from . import tree
from .plan import KV_BLOCK


class Slot:
    """The buffers of one conversation's keys and values, and the graphs captured over them."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device):
        self.shape = (layers, 1, kv_heads, 0, head_dim)
        self.dtype, self.device = dtype, device
        self.keys = self.values = torch.zeros(self.shape, dtype=dtype, device=device)
        self.graphs: dict = {}  # T bucket -> a graph captured over these buffers (peers/graphs.py)

    @property
    def capacity(self) -> int:
        return self.keys.shape[3]

    def reserve(self, n: int) -> None:
        """Room for positions 0..n-1, keeping what is held. Zeros, not empty: a padded pass reads columns its
        mask hides, and a hidden NaN would still spoil the sum (0 x NaN)."""
        if n <= self.capacity:
            return
        shape = list(self.shape)
        shape[3] = -(-n // KV_BLOCK) * KV_BLOCK
        keys, values = (torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(2))
        keys[..., : self.capacity, :] = self.keys
        values[..., : self.capacity, :] = self.values
        self.keys, self.values = keys, values
        self.graphs.clear()  # they point at the old buffers


@dataclass
class SessionCache:
    """One conversation on one shard: its slot, and how many positions of it hold the conversation."""

    slot: Slot
    length: int = 0
    last_used: float = field(default_factory=time.monotonic)


def recycle(shard: weakref.ref, slot: Slot, keep: int) -> None:
    """(when a SessionCache is freed) A slot with captured graphs goes back to its shard (if that still lives)
    for the next conversation: capturing again costs more than keeping them."""
    owner = shard()
    if owner is not None and slot.graphs and len(owner.spare) < keep:
        owner.spare.append(slot)


class Writer:
    """What transformers' attention layers call as their cache during one pass: `update` writes the pass's keys
    and values at their cache indices and returns the columns [lo, hi) that the layer's mask covers."""

    def __init__(self, slot: Slot, first_layer: int, index: torch.Tensor, views: dict[int, tuple[int, int]]):
        self.slot, self.first, self.index, self.views = slot, first_layer, index, views

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        keys, values = self.slot.keys[layer_idx - self.first], self.slot.values[layer_idx - self.first]
        keys.index_copy_(2, self.index, key_states)
        values.index_copy_(2, self.index, value_states)
        lo, hi = self.views[layer_idx]
        return keys[:, :, lo:hi], values[:, :, lo:hi]


def meta(committed: int, n_tokens: int, parents: list[int] | None, size: int) -> torch.Tensor:
    """(host) A pass of n_tokens as one small tensor, padded to `size` rows: [committed, positions (size),
    which pass columns each row sees (size x size)]. A padding row sits at the last real position (the highest
    position in the pass stays the real one) and sees only itself and the committed prefix."""
    pos = tree.positions(committed, n_tokens, parents or [])[0].tolist()
    pos += [pos[-1]] * (size - n_tokens)
    sees = tree.ancestors(n_tokens, parents or [], size)
    return torch.cat([torch.tensor([committed] + pos), sees.flatten().long()])


def unpack(m: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(device) meta -> (committed as a 0-d tensor, positions [1, size], sees [size, size] bool)."""
    return m[0], m[1 : 1 + size][None], m[1 + size :].view(size, size).bool()


def visible(committed: torch.Tensor, pos: torch.Tensor, sees: torch.Tensor, lo: int, hi: int,
            window: int | None) -> torch.Tensor:
    """(device) Boolean mask [1, 1, T, hi - lo] over cache columns lo..hi-1 (True: may attend). The committed
    prefix is seen by every row, the pass's own columns as `sees` says, nothing after; a sliding window also
    hides a column whose position is `window` or more before the row's."""
    col = torch.arange(lo, hi, device=pos.device)
    j = col - committed  # the column's row in this pass; negative: the committed prefix
    t = pos.shape[-1]
    jc = j.clamp(0, t - 1)
    allowed = (sees[:, jc] & (j < t)) | (j < 0)
    if window is not None:
        kv_pos = torch.where(j < 0, col, pos[0, jc])
        allowed &= (pos[0, :, None] - kv_pos[None, :]) < window
    return allowed[None, None]
