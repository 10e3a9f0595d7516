"""Device work is asynchronous on a GPU: a kernel launch returns at once. Whoever times a computation or copies its
result waits for it first, on a worker thread (never on trio's, which answers heartbeats); on a CPU every op has
finished when it returns, so these cost nothing there."""
from __future__ import annotations

import functools
import socket
from pathlib import Path

import torch


def finish(device: torch.device | str) -> None:
    """Wait for the work this thread queued on `device` (CUDA only): one event recorded on its stream, not a
    synchronisation of the whole device, which would also wait for work on other streams."""
    if torch.device(device).type == "cuda":
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(device))
        done.synchronize()


def pinned(device: torch.device | str) -> bool:
    """Whether host buffers bound for `device` are pinned: on CUDA, so copies to it run without blocking."""
    return torch.device(device).type == "cuda" and torch.cuda.is_available()


@functools.cache
def compute_id(device: torch.device | str) -> str:
    """What computes on `device`, the same for every process that shares it: a GPU's own id, or the machine's for
    its CPU (processes in network namespaces of one machine share its cores, and its boot id). The host sends
    as many passes round at once as its ring has of these (peers/host/batcher.py)."""
    d = torch.device(device)
    if d.type == "cuda":
        return "cuda:" + str(torch.cuda.get_device_properties(d.index or 0).uuid)
    for f in ("/proc/sys/kernel/random/boot_id", "/etc/machine-id"):
        try:
            return f"{d.type}:" + Path(f).read_text().strip()
        except OSError:
            continue
    return f"{d.type}:" + socket.gethostname()
