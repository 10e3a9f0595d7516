"""torch's CPU thread count belongs to each OS thread: torch.set_num_threads sets the calling thread's count and the
process default, and a thread takes the default the first time it runs a torch op.

The feature draft runs on one thread (see FeatureDrafter.propose), so the default dips to 1 while it drafts; the
host's compute threads set their own count on every call, so one that first runs while a draft does still gets
the full count."""
from __future__ import annotations

from contextlib import contextmanager

import torch


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
