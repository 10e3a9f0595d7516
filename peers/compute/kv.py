"""Every conversation's keys and values on one member, in one arena allocated when the member loads its span.

The arena is two tensors [layers, rows + 1, kv_heads, room, head_dim]: a row of `room` positions (--max-context and
a graph bucket's padding, peers/plan/layers.py cache_positions) for each conversation the plan admits, and one scratch row
that a padded batch's empty places write to. Nothing in it is ever reallocated, so a CUDA graph captured over it
(peers/compute/graphs.py) stays valid for the member's life. A conversation takes a row at its first pass and gives it
back when it ends; a member asked for one more row than it has takes the row of the conversation idle longest
(the host replays that one if it comes back: the rollback rule below).

A pass writes its keys and values at cache columns committed..committed+T-1, and attention reads the columns a
mask allows. The rollback rule is setting `length`: what lies past it is overwritten by the next pass.
Sliding-window layers keep every position too (the mask applies the window), so a rollback never needs states a
window dropped.

Everything a pass needs besides its input travels in one small tensor per conversation (`meta`: committed, each
row's position, which rows of the pass each row sees); masks, cache columns and rotary embeddings are computed
from it on the device, so a captured graph reads the next pass's values from the same buffer.
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field

import torch

from peers.base import tree_layout


class RoomError(ValueError):
    """A conversation past the room its member's arena keeps for it (one line for the user)."""


class Arena:
    def __init__(self, layers: int, rows: int, kv_heads: int, head_dim: int, room: int, dtype: torch.dtype,
                 device: torch.device, zeroed: bool):
        """zeroed: where a pass may read columns nobody wrote (a padded pass reads a row's whole room, masked; a
        hidden NaN would still spoil the sum, 0 x NaN). An eager pass reads only what was written, so on a CPU the
        arena's pages are touched only as conversations fill them."""
        shape = (layers, rows + 1, kv_heads, room, head_dim)
        make = torch.zeros if zeroed else torch.empty
        self.keys, self.values = (make(shape, dtype=dtype, device=device) for _ in range(2))
        self.rows, self.room, self.scratch = rows, room, rows
        self.free = list(range(rows - 1, -1, -1))
        self.holders: dict[int, weakref.ref] = {}  # row -> the SessionCache holding it

    @property
    def bytes(self) -> int:
        return 2 * self.keys.numel() * self.keys.element_size()

    def place(self, caches: list["SessionCache"]) -> None:
        """A row for each of these conversations that lacks one: a free one, else the row of the conversation
        (not among these) idle longest, which is told it lost its positions."""
        for s in caches:
            if s.cell[0] is not None:
                continue
            if not self.free:
                idle = [(h.last_used, row, h) for row, ref in self.holders.items()
                        if (h := ref()) is not None and all(h is not c for c in caches)]
                if not idle:
                    raise RoomError(f"this member's arena holds {self.rows} conversations and a pass asked for more")
                _, row, victim = min(idle, key=lambda v: v[0])
                victim.cell[0], victim.length, victim.evicted = None, 0, True
                self.free.append(row)
            row = self.free.pop()
            s.cell[0], s.evicted = row, False
            self.holders[row] = weakref.ref(s)
            weakref.finalize(s, self._release, s.cell)

    def clear_tail(self, row: int, end: int, step: int) -> None:
        """Zero a row's columns from `end` to the next multiple of `step` (within the room), in every layer: a pass
        that reads up to there masks them, and a masked key's value still enters the sum as 0 x value, which must
        not be a stale NaN of memory nobody wrote."""
        stop = min(self.room, -(-end // step) * step)
        if stop > end:
            self.keys[:, row, :, end:stop] = 0
            self.values[:, row, :, end:stop] = 0

    def _release(self, cell: list) -> None:
        if cell[0] is not None:
            self.holders.pop(cell[0], None)
            self.free.append(cell[0])
            cell[0] = None


@dataclass(eq=False)
class SessionCache:
    """One conversation on one member: its row of the arena (None until its first pass), and how many positions
    of it hold the conversation. `evicted`: its row went to another conversation; it holds nothing."""

    length: int = 0
    last_used: float = field(default_factory=time.monotonic)
    cell: list = field(default_factory=lambda: [None])  # [row]: shared with the finalizer that frees it
    evicted: bool = False

    @property
    def row(self) -> int | None:
        return self.cell[0]

    def get_seq_length(self) -> int:  # (as transformers' caches: what drafting together reads and rolls back)
        return self.length

    def crop(self, n: int) -> None:  # n < 0: drop that many positions; else keep the first n
        self.length = max(0, self.length + n) if n < 0 else min(self.length, n)


class ArenaWriter:
    """What transformers' attention layers call as their cache during a padded pass of B rows: `update` writes the
    pass's keys and values [B, kv_heads, T, head_dim] at their rows and columns and returns each row's whole room.
    rows [B], columns [B, T]: tensors on the device (a graph's inputs)."""

    def __init__(self, arena: Arena, first_layer: int, rows: torch.Tensor, columns: torch.Tensor):
        self.arena, self.first, self.rows, self.columns = arena, first_layer, rows, columns

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        keys, values = self.arena.keys[layer_idx - self.first], self.arena.values[layer_idx - self.first]
        at = (self.rows[:, None], slice(None), self.columns)  # -> [B, T, kv_heads, head_dim]
        keys[at] = key_states.transpose(1, 2)
        values[at] = value_states.transpose(1, 2)
        return keys[self.rows], values[self.rows]


def check_keep(keep, committed: int, length: int) -> None:
    """A pass's kept columns (peers/compute/shard.py forward), or ValueError in one line: None, or ascending distinct
    columns in [committed, length), the positions of a pass still in flight."""
    if keep is None:
        return
    if not isinstance(keep, list) or not all(isinstance(c, int) and not isinstance(c, bool) for c in keep):
        raise ValueError("keep must list cache columns")
    if any(b <= a for a, b in zip(keep, keep[1:])):
        raise ValueError(f"keep must list distinct cache columns in ascending order, not {keep[:8]}")
    if keep and not (committed <= keep[0] and keep[-1] < length):
        raise ValueError(f"keep names columns {keep[0]}..{keep[-1]} but this peer holds uncommitted columns "
                         f"{committed}..{length - 1} only")


def meta(committed: int, n_tokens: int, parents: list[int] | None, size: int) -> torch.Tensor:
    """(host) A pass of n_tokens as one small tensor, padded to `size` rows: [committed, positions (size),
    which pass columns each row sees (size x size)]. A padding row sits at the last real position (the highest
    position in the pass stays the real one) and sees only itself and the committed prefix."""
    pos = tree_layout.positions(committed, n_tokens, parents or [])[0].tolist()
    pos += [pos[-1]] * (size - n_tokens)
    sees = tree_layout.ancestors(n_tokens, parents or [], size)
    return torch.cat([torch.tensor([committed] + pos), sees.flatten().long()])


def unpack(m: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(device) metas [B, 1 + size + size^2] -> (committed [B], positions [B, size], sees [B, size, size] bool)."""
    return m[:, 0], m[:, 1 : 1 + size], m[:, 1 + size :].view(-1, size, size).bool()


def visible(committed: torch.Tensor, pos: torch.Tensor, sees: torch.Tensor, lo: int, hi: int,
            window: int | None, span_pos: torch.Tensor | None = None) -> torch.Tensor:
    """(device) Boolean mask [B, 1, T, hi - lo] over cache columns lo..hi-1 (True: may attend). The committed
    prefix is seen by every row, the pass's own columns as `sees` says, nothing after; a sliding window also
    hides a column whose position is `window` or more before the row's. sees [B, T, W]: the pass's W columns
    from `committed` on, the rows' own the last T of them (W > T: positions kept from a pass still in flight,
    peers/compute/shard.py), at positions span_pos [B, W] (None: W = T and they are the rows' own, `pos`)."""
    col = torch.arange(lo, hi, device=pos.device)
    b, t, w = sees.shape
    span_pos = pos if span_pos is None else span_pos
    j = col[None, :] - committed[:, None]  # [B, C]: the column's place in this pass; negative: the committed prefix
    jc = j.clamp(0, w - 1)
    allowed = torch.gather(sees, 2, jc[:, None, :].expand(b, t, -1))
    allowed = (allowed & (j < w)[:, None, :]) | (j < 0)[:, None, :]
    if window is not None:
        kv_pos = torch.where(j < 0, col[None, :], torch.gather(span_pos, 1, jc))
        allowed &= (pos[:, :, None] - kv_pos[:, None, :]) < window
    return allowed[:, None]
