"""A checkpoint's tensors read into memory, whole or a few rows at a time, with plain reads into their own
buffer: no mapping of the file, whose pages would count as this process's memory while it lives, and nothing
read that is not asked for. A loader that quantizes reads a matrix in row chunks (peers/compute/quant.py), so what it
holds in full precision at any moment is one chunk, however the machine schedules it.
"""
from __future__ import annotations

from math import prod

import torch

from peers.base.dtypes import STORED
from peers.models.checkpoint import Stored



def read(st: Stored, dtype: torch.dtype) -> torch.Tensor:
    """The whole tensor on the CPU in `dtype`."""
    rows = st.shape[0] if st.shape else 1
    return read_rows(st, 0, rows, dtype).reshape(st.shape)


def read_rows(st: Stored, start: int, end: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows [start, end) of the tensor (along its first dimension) on the CPU in `dtype`."""
    stored = STORED.get(st.dtype)
    if stored is None:
        raise ValueError(f"tensors of dtype {st.dtype} are not supported")
    row = prod(st.shape[1:]) * stored.itemsize
    buf = torch.empty((end - start) * row, dtype=torch.uint8)
    view, got = memoryview(buf.numpy()), 0
    with open(st.path, "rb", buffering=0) as f:
        f.seek(st.offset + start * row)
        while got < len(view):
            n = f.readinto(view[got:])
            if not n:
                raise ValueError(f"{st.path.name} ends inside a tensor")
            got += n
    return buf.view(stored).reshape(end - start, *st.shape[1:]).to(dtype)
