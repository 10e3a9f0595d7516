"""CUDA graphs of a shard's short passes: one per (B bucket, T bucket), captured at first use, replayed after.

A pass of B conversations with at most 128 positions each is padded up to (B bucket, T bucket): B to 1, 2, 4, 8
or 16 rows (an empty row writes to the arena's scratch row), T to 1, 2, 4, … 128 positions (a token and a tree of
drafts), and every row runs over its conversation's whole room in the arena (peers/compute/kv.py) with a mask. So its
shapes and addresses are the same every time and one captured graph replays it: one launch instead of one per
kernel. The arena is never reallocated, so a graph stays valid for the member's life; each graph has its own input
buffers. Longer passes (prefill chunks) and larger batches run eagerly.

Captures and replays run on the process's device runtime (peers/compute/runtime.py). A shard that cannot capture (a
quantized kernel that syncs, say) says so once and runs eagerly. On a CPU the same padded pass runs eagerly
(`capture=False`): the tests check there that padding changes nothing.
"""
from __future__ import annotations

import logging
from collections import Counter

import torch
import torch.nn.functional as F

from peers.base.limits import BATCH_BUCKETS, GRAPH_BUCKETS
from peers.compute.runtime import RUNTIME

log = logging.getLogger("sfchat.graphs")


def bucket(n: int, buckets=GRAPH_BUCKETS) -> int | None:
    """The bucket n positions (or conversations) are padded to; None: more than any (the pass runs eagerly)."""
    return next((b for b in buckets if b >= n), None)


def shape(b: int, t: int) -> tuple[int, int] | None:
    """(B bucket, T bucket) of a pass of b conversations with at most t positions each; None: eager."""
    bb, tb = bucket(b, BATCH_BUCKETS), bucket(t)
    return (bb, tb) if bb and tb else None


def pad(x: torch.Tensor, size: int) -> torch.Tensor:
    """ids [1, T] or hidden states [1, T, H] padded with zeros to `size` positions."""
    extra = size - x.shape[1]
    return F.pad(x, (0, extra) if x.dim() == 2 else (0, 0, 0, extra))


class Graphs:
    def __init__(self, device: torch.device, capture: bool):
        self.device, self.capture = device, capture
        self.pool = torch.cuda.graph_pool_handle() if capture else None  # one memory pool for all our graphs
        self.graphs: dict[tuple[int, int], tuple] = {}  # (B, T) -> (graph, its input buffers, its output)
        self.failed = False
        self.padded: Counter = Counter()  # (B, T) -> passes padded to it (what the tests check)

    def run(self, step, key: tuple[int, int], x: torch.Tensor, meta: torch.Tensor, rows: torch.Tensor):
        """step(x, meta, rows) over the padded pass (x [B, T(, H)], meta and rows on the host), replayed from
        the graph of its shape where one can be captured."""
        self.padded[key] += 1
        if not self.capture or self.failed:
            return step(x.to(self.device), meta.to(self.device), rows.to(self.device))
        got = self.graphs.get(key)
        if got is None:
            inputs = tuple(torch.empty_like(t, device=self.device) for t in (x, meta, rows))
            for buf, t in zip(inputs, (x, meta, rows)):
                buf.copy_(t)
            try:
                graph, out = RUNTIME.capture(self.device, lambda: step(*inputs), self.pool)
            except Exception as e:  # the pass itself still runs, eagerly
                self.failed = True
                log.warning("CUDA graphs are off on this member: capturing a pass of %d x %d positions failed "
                            "(%s: %s); passes run eagerly", *key, type(e).__name__,
                            str(e).splitlines()[0] if str(e) else "")
                return step(*inputs)
            got = self.graphs[key] = (graph, inputs, out)
        graph, inputs, out = got
        for buf, t in zip(inputs, (x, meta, rows)):
            buf.copy_(t, non_blocking=True)
        graph.replay()
        return out.clone()  # the pool's memory is every graph's scratch: copy out before another replays

    @property
    def captured(self) -> int:
        return len(self.graphs)

    def close(self) -> None:
        """(a re-plan) The graphs and their pool go with the shard."""
        self.graphs.clear()
