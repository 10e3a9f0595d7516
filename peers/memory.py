"""What a process can offer and what it uses: free device memory and resident set size."""
from __future__ import annotations

import os

import torch


def free_bytes(device: str) -> int:
    if device.startswith("cuda") and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return free
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of this process (or of `pid`)."""
    with open(f"/proc/{pid or os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def pick_dtype(name: str, device: str) -> str:
    """`auto`: bfloat16 on a CUDA device that computes in it (compute capability 8+), float16 on older CUDA
    devices, float32 on the CPU (where half precision is slower and less exact); any other name as given."""
    if name != "auto":
        return name
    if not str(device).startswith("cuda"):
        return "float32"
    return "bfloat16" if torch.cuda.get_device_capability(torch.device(device))[0] >= 8 else "float16"
