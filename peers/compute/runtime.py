"""The one device runtime of a process: every piece of GPU work (ring passes, drafts, graph captures) runs on its one
thread, so a capture never overlaps another thread's work and a graph is replayed by the thread that captured it
(pytorch#123177).

It owns the streams (the ring's passes at high priority, look-ahead drafts at low, so a stage never queues behind
a draft's kernels), the one lock under which graphs are captured and the caching allocator is emptied
(`empty_cache` inside a capture asserts), and one side stream for capture warm-ups. On a CPU every call is a plain
call on the caller's thread.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

RING, DRAFT = "ring", "draft"  # the lanes: their streams' priorities
PRIORITY = {RING: -1, DRAFT: 0}  # lower is sooner (CUDA clamps to the device's range)


class Runtime:
    def __init__(self):
        self._pool: ThreadPoolExecutor | None = None
        self._owner: threading.Thread | None = None
        self._lock = threading.Lock()
        self.capture_lock = threading.RLock()
        self._streams: dict[tuple[int, str], torch.cuda.Stream] = {}
        self.captures = 0  # graphs captured by this process (tests and gpu_check assert it)

    def call(self, device, fn, *args, lane: str = RING):
        """fn(*args) where the device's work belongs: on the runtime's thread, on `lane`'s stream, for a GPU."""
        device = torch.device(device)
        if device.type != "cuda":
            return fn(*args)
        if threading.current_thread() is self._owner:  # (a call from inside a call)
            return self._run(device, lane, fn, args)
        return self._thread().submit(self._run, device, lane, fn, args).result()

    def _thread(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="device", initializer=self._own)
            return self._pool

    def _own(self) -> None:
        self._owner = threading.current_thread()

    def _run(self, device: torch.device, lane: str, fn, args):
        index = torch.cuda.current_device() if device.index is None else device.index
        torch.cuda.set_device(index)  # (each thread has its own current device)
        with torch.inference_mode(), torch.cuda.stream(self.stream(index, lane)):
            return fn(*args)

    def stream(self, index: int, lane: str) -> torch.cuda.Stream:
        key = (index, lane)
        if key not in self._streams:
            self._streams[key] = torch.cuda.Stream(index, priority=PRIORITY.get(lane, 0))
        return self._streams[key]

    def capture(self, device: torch.device, step, pool) -> tuple[torch.cuda.CUDAGraph, object]:
        """(on the runtime's thread) A graph of step(): a warm-up on the side stream first (cuBLAS handles, lazy
        inits; it computes the very pass, and writing the same keys and values twice is harmless), then the
        capture, under the capture lock."""
        index = torch.cuda.current_device() if device.index is None else device.index
        side, here = self.stream(index, "capture"), torch.cuda.current_stream(index)
        with self.capture_lock:
            side.wait_stream(here)
            with torch.cuda.stream(side):
                step()
            here.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=side, capture_error_mode="thread_local"):
                out = step()
            self.captures += 1
        return graph, out

    def empty_cache(self) -> None:
        """Give the caching allocator's free blocks back to the device, never while a graph is being captured."""
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            with self.capture_lock:
                torch.cuda.empty_cache()


class Pinned:
    """A pinned host buffer that one direction of a hop reuses pass after pass (grown as needed, never shrunk):
    the copy to or from the GPU runs without blocking, and no pass pays for pinning new memory. Its user must be
    done with one pass's bytes (copied to the device, or sent) before the next pass asks for a view."""

    def __init__(self):
        self.buf: torch.Tensor | None = None

    def view(self, dtype: torch.dtype, shape) -> torch.Tensor:
        n = math.prod(shape) * dtype.itemsize
        if self.buf is None or self.buf.numel() < n:
            self.buf = torch.empty(max(n, 2 * (self.buf.numel() if self.buf is not None else 0)), dtype=torch.uint8,
                                   pin_memory=True)
        return self.buf[:n].view(dtype).view(shape)


RUNTIME = Runtime()


# torch's CPU thread count belongs to each OS thread: torch.set_num_threads sets the calling thread's count and the
# process default, and a thread takes the default the first time it runs a torch op.
#
# The feature draft runs on one thread (see FeatureDrafter.propose), so the default dips to 1 while it drafts; the
# host's compute threads set their own count on every call, so one that first runs while a draft does still gets
# the full count.
@contextmanager
def torch_threads(n: int):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def call_with_threads(n: int, fn, *args):
    with torch_threads(n):
        return fn(*args)
