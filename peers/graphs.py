"""CUDA graphs of a shard's short passes: one per (conversation slot, T bucket), captured lazily, replayed after.

A pass of T <= 128 positions is padded up to its bucket (1, 2, 4, … 128) and runs over the slot's whole
capacity with a mask (peers/kv.py), so its shapes and addresses are the same every time and one captured graph
replays it: one launch instead of one per kernel. Longer passes (prefill chunks) run eagerly. Slots with graphs
are reused by the next conversation (kv.recycle), so a member captures a bucket once, not once per chat.

A graph is captured and replayed by one thread (pytorch#123177): every pass of a shard with graphs runs on its own
thread. A shard that cannot capture (a quantized kernel that syncs, say) says so once and runs eagerly. On a CPU
the same padded pass runs eagerly (`capture=False`): the tests check there that padding changes nothing.
"""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F

from .plan import GRAPH_BUCKETS

log = logging.getLogger("sfchat.graphs")


def bucket(n: int) -> int | None:
    """The bucket a pass of n positions is padded to; None: longer than any (it runs eagerly)."""
    return next((b for b in GRAPH_BUCKETS if b >= n), None)


def pad(x: torch.Tensor, size: int) -> torch.Tensor:
    """ids [1, T] or hidden states [1, T, H] padded with zeros to `size` positions."""
    extra = size - x.shape[1]
    return F.pad(x, (0, extra) if x.dim() == 2 else (0, 0, 0, extra))


class Graphs:
    def __init__(self, device: torch.device, capture: bool):
        self.device, self.capture = device, capture
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="cuda-graphs") if capture else None
        # plain "cuda" is the device current where the shard was built (set_device refuses it without an index)
        self.index = (torch.cuda.current_device() if device.index is None else device.index) if capture else None
        self.pool = torch.cuda.graph_pool_handle() if capture else None  # one memory pool for all our graphs
        self.inputs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # bucket -> (x, meta) the graphs read
        self.failed = False

    def call(self, fn, *args):
        """Run fn on the thread that owns the graphs (directly where nothing is captured)."""
        if self.thread is None:
            return fn(*args)
        return self.thread.submit(self._on_thread, fn, *args).result()

    def _on_thread(self, fn, *args):
        torch.cuda.set_device(self.index)  # (each thread has its own current device)
        with torch.inference_mode():
            return fn(*args)

    def run(self, step, slot, b: int, x: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
        """step(slot, x, meta) over the padded pass, replayed from a graph where one can be captured; the
        result's first x.shape[1] positions. meta: on the host (peers/kv.py)."""
        n = x.shape[1]
        x = pad(x, b)
        if not self.capture or self.failed:
            return step(slot, x, meta.to(self.device))[:, :n]
        x_in, meta_in = self._inputs(b, x, meta)
        x_in.copy_(x)
        meta_in.copy_(meta)
        got = slot.graphs.get(b)
        if got is None:
            try:
                got = slot.graphs[b] = self._capture(step, slot, x_in, meta_in)
            except Exception as e:  # the pass itself still runs, eagerly
                self.failed = True
                log.warning("CUDA graphs are off on this member: capturing a pass of %d positions failed (%s: %s); "
                            "passes run eagerly", b, type(e).__name__, str(e).splitlines()[0] if str(e) else "")
                return step(slot, x, meta_in)[:, :n]
        graph, out = got
        graph.replay()
        return out[:, :n].clone()  # the pool's memory is every graph's scratch: copy out before another replays

    def _inputs(self, b: int, x: torch.Tensor, meta: torch.Tensor):
        if b not in self.inputs or self.inputs[b][0].dtype != x.dtype:
            self.inputs[b] = (torch.empty_like(x), torch.empty_like(meta, device=self.device))
        return self.inputs[b]

    def _capture(self, step, slot, x_in, meta_in):
        # a warm-up on a side stream first (cuBLAS handles, lazy inits); it computes this very pass, and writing the
        # same keys and values again is harmless
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            step(slot, x_in, meta_in)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the host's draft may use the GPU from its own thread meanwhile
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            out = step(slot, x_in, meta_in)
        return graph, out

    def close(self) -> None:
        if self.thread is not None:
            self.thread.shutdown()
