"""Attention whose result at a row depends only on the keys that row sees: never on the pass around it.

torch's CPU attention kernel (scaled_dot_product_attention's flash kernel) splits its queries into blocks whose size
follows the pass's length, and reduces over keys in blocks whose size follows the keys' count; in bfloat16 the
rounding follows those blocks, so a position's hidden state changed with how many positions its pass carried and
where a tree put its ancestors. Measured on the kernel (tests/unit/compute/test_invariant.py): with queries in
blocks of a fixed QUERY_BLOCK and keys in position order, padded with masked keys to a multiple of KEY_STEP, a row's
result is the same bits whatever the other rows of its block, the number of blocks and the keys after its own.

So each row attends to its keys laid out as a one-token pass would see them: the conversation's positions
0..p in order. A chain's rows read the arena's row as it is. A tree's node sees the committed prefix and then its
ancestors, which a pass lays out depth-first, so a side branch's ancestors are not contiguous: for each side path
(root to leaf) its columns are copied over the main chain's after the prefix, its rows computed, and the main
chain's columns put back (a few columns a layer; never the prefix).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

QUERY_BLOCK = 16  # queries per block of the kernel: fixed, so its matrix products keep one shape
KEY_STEP = 16  # keys padded (masked) to a multiple of this: the kernel's vector width over keys


@dataclass
class Group:
    """Query rows that attend to one contiguous run of columns 0..width-1 of their conversation's row, after
    `src` columns (if any) are copied to `dst`.. for the group's computation."""

    rows: list[int]  # the pass's query rows (0..t-1)
    positions: list[int]  # each row's position: it sees columns 0..position (within a window, if any)
    width: int
    dst: int = 0
    src: tuple[int, ...] = ()
    made: dict = field(default_factory=dict, repr=False, compare=False)  # what every layer of the pass reuses

    def tensors(self, device, rep: int, room: int, window: int | None):
        """(rows, src columns, the padded width, the blocks' mask), made once a pass for each kind of layer."""
        key = (rep, room, window)
        if key not in self.made:
            width = min(room, -(-self.width // KEY_STEP) * KEY_STEP)
            n = rep * len(self.rows)
            blocks = -(-n // QUERY_BLOCK)
            at = torch.tensor(self.positions * rep + [0] * (blocks * QUERY_BLOCK - n), device=device)
            col = torch.arange(width, device=device)
            sees = col[None, :] <= at[:, None]  # a padding row sits at position 0: it sees one key, is thrown away
            if window is not None:
                sees &= col[None, :] > at[:, None] - window
            self.made[key] = (torch.tensor(self.rows, device=device),
                              torch.tensor(self.src, device=device) if self.src else None,
                              width, sees.view(blocks, 1, QUERY_BLOCK, width))
        return self.made[key]


def groups(committed: int, kept: int, full: list[int]) -> list[Group]:
    """(once a pass) The query rows of a pass of len(full) columns from `committed` on (the first `kept` moved
    there from a pass in flight: no queries), grouped by root-to-leaf path: the main chain first, in place, then
    each side path not yet computed, moved after the prefix it shares with the main chain."""
    depth: list[int] = []
    for p in full:
        depth.append(1 + (depth[p] if p >= 0 else 0))
    main = 0
    while main < len(full) and full[main] == main - 1:
        main += 1
    out = []
    rows = [j for j in range(kept, main)]
    if rows:
        out.append(Group([j - kept for j in rows], [committed + j for j in rows], committed + main))
    done = set(range(main))
    parents = set(full)
    for leaf in range(main, len(full)):
        if leaf in parents:
            continue
        path = [leaf]
        while full[path[0]] >= 0:
            path.insert(0, full[path[0]])
        rows = [j for j in path if j >= kept and j not in done]
        done.update(path)
        if not rows:
            continue
        split = next(d for d, j in enumerate(path) if j != d)  # where the path leaves the main chain
        out.append(Group([j - kept for j in rows], [committed + depth[j] - 1 for j in rows], committed + len(path),
                         committed + split, tuple(committed + j for j in path[split:])))
    return out


def attend(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, plan: list[Group], scaling: float,
           window: int | None) -> torch.Tensor:
    """query [1, heads, t, D]; keys and values: the conversation's whole row [1, kv_heads, room, D] for this layer,
    every column the pass wrote already there. Returns [1, t, heads, D] as transformers' attention functions do."""
    _, heads, t, dim = query.shape
    kv_heads, room = keys.shape[1], keys.shape[2]
    rep = heads // kv_heads
    out = query.new_empty(1, heads, t, dim)
    for g in plan:
        rows, src, width, mask = g.tensors(query.device, rep, room, window)
        if src is not None:
            saved = [c[:, :, g.dst : g.dst + len(g.src)].clone() for c in (keys, values)]
            for c in (keys, values):
                c[:, :, g.dst : g.dst + len(g.src)] = c.index_select(2, src)
        out[:, :, rows] = _blocks(query[:, :, rows], keys[:, :, :width], values[:, :, :width], mask, scaling)
        if src is not None:
            for c, s in zip((keys, values), saved):
                c[:, :, g.dst : g.dst + len(g.src)] = s
    return out.transpose(1, 2)


def _blocks(q, k, v, mask, scaling: float) -> torch.Tensor:
    """q [1, heads, r, D] over keys [1, kv_heads, W, D] at positions 0..W-1: each kv head's queries (its heads x r
    rows) cut into blocks of QUERY_BLOCK, the blocks a batch over the same keys (expanded: no copy)."""
    _, heads, r, dim = q.shape
    kv_heads = k.shape[1]
    n = heads // kv_heads * r
    blocks = mask.shape[0]
    qs = F.pad(q.reshape(kv_heads, n, dim), (0, 0, 0, blocks * QUERY_BLOCK - n))  # rows (head, row), then padding
    qs = qs.view(kv_heads, blocks, QUERY_BLOCK, dim).transpose(0, 1)  # [blocks, kv_heads, QUERY_BLOCK, D]
    o = F.scaled_dot_product_attention(qs, k.expand(blocks, -1, -1, -1), v.expand(blocks, -1, -1, -1),
                                       attn_mask=mask, scale=scaling)
    return o.transpose(0, 1).reshape(kv_heads, blocks * QUERY_BLOCK, dim)[:, :n].reshape(1, heads, r, dim)
