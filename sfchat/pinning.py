"""`sfchat bench --pin`: the host and each local member on cores of their own, torch's threads to match: a machine
per member on one box.

The cores this process may use are split into as many contiguous blocks as there are processes (the host first,
then member 1, 2, …): on 2 cores with one member, the host on core 0 and the member on core 1. With more processes
than cores, each gets one core, round-robin. A member pins itself as it starts (CORES_ENV in its environment,
read before torch starts its thread pool); the host pins every thread it already has, and threads started later
inherit it."""
from __future__ import annotations

import os

CORES_ENV = "SFCHAT_CORES"


def can_pin() -> bool:
    return hasattr(os, "sched_setaffinity")  # Linux; not macOS


def split(processes: int, cores: list[int]) -> list[list[int]]:
    """The cores of each process: contiguous blocks of the same size (the first ones one more where they do not
    divide), or with more processes than cores one each, round-robin."""
    if processes > len(cores):
        return [[cores[i % len(cores)]] for i in range(processes)]
    size, extra = divmod(len(cores), processes)
    out, at = [], 0
    for i in range(processes):
        n = size + (i < extra)
        out.append(cores[at:at + n])
        at += n
    return out


def pin_self(cores: list[int]) -> None:
    """This process, every thread of it, on `cores`; torch's threads as many as the cores."""
    import torch

    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, cores)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
    torch.set_num_threads(len(cores))


def pin_from_env() -> None:
    """In a local member started with cores (bench --pin): pin itself, before anything runs on torch."""
    text = os.environ.pop(CORES_ENV, None)
    if text and can_pin():
        pin_self([int(c) for c in text.split(",")])


def cores_text(cores: list[int]) -> str:
    """0 -> "core 0"; 0,1,2 -> "cores 0-2"; 0,2 -> "cores 0,2"."""
    if len(cores) == 1:
        return f"core {cores[0]}"
    if cores == list(range(cores[0], cores[-1] + 1)):
        return f"cores {cores[0]}-{cores[-1]}"
    return "cores " + ",".join(map(str, cores))
