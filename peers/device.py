"""Device work is asynchronous on a GPU: a kernel launch returns at once. Whoever times a computation or copies its
result waits for it first, on a worker thread (never on trio's, which answers heartbeats); on a CPU every op has
finished when it returns, so these cost nothing there."""
from __future__ import annotations

import torch


def finish(device: torch.device | str) -> None:
    """Wait for the work queued on `device` (CUDA only)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
