"""Tensors on the wire: a map of dtype name and shape in the CBOR body, the bytes themselves raw after it
(wire.py); no pickle, and no copy on the way that the socket does not make.

A tensor leaves from its own memory (a GPU's through a pinned host buffer) and lands in one allocated for it
once its header was checked (pinned when it goes on to a GPU), which it then shares.
"""
from __future__ import annotations

import torch

from peers.base.dtypes import DTYPE_NAMES, DTYPES  # noqa: F401 (the names a tensor's header may carry)
from peers.wire.codec import WireError

MAX_ELEMENTS = 1 << 28


def host_bytes(t: torch.Tensor, wire_dtype: torch.dtype | None = None, pinned=None) -> tuple[dict, memoryview]:
    """(header, raw bytes) of t on the CPU. A GPU tensor is copied into pinned memory without waiting (`pinned`'s,
    a peers/runtime.Pinned, if given): the caller waits for its device (device.finish) before the bytes are read."""
    t = t.detach()
    if wire_dtype is not None and t.dtype != wire_dtype:
        t = t.to(wire_dtype)
    if t.device.type == "cpu":
        t = t.contiguous()
    else:
        out = pinned.view(t.dtype, t.shape) if pinned is not None else torch.empty(t.shape, dtype=t.dtype,
                                                                                    pin_memory=True)
        t = out.copy_(t, non_blocking=True)
    return {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape)}, byte_view(t)


def byte_view(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, shared (the view keeps the tensor alive)."""
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def landing(header: object, n: int, pin: bool = False) -> memoryview:
    """A buffer for the n raw bytes of the tensor `header` describes, once the header and n agree (WireError
    otherwise): pinned memory when the tensor goes on to a GPU."""
    dtype, shape = check(header, n)
    return byte_view(torch.empty(shape, dtype=dtype, pin_memory=pin))


def from_bytes(header: object, raw: object) -> torch.Tensor:
    """The tensor `header` describes, sharing the bytes `raw` (a writable buffer, as landing gives)."""
    if raw is None:
        raise WireError("tensor bytes must follow the frame's body as raw bytes")
    raw = memoryview(raw).cast("B")
    dtype, shape = check(header, len(raw))
    if not len(raw):
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape)


def check(d: object, n: int) -> tuple[torch.dtype, list[int]]:
    """The dtype and shape a tensor header names, if they fit n bytes and the limits."""
    if not isinstance(d, dict):
        raise WireError("tensor must be a map")
    dtype, shape = d.get("dtype"), d.get("shape")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise WireError(f"unknown tensor dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(s, int) and 0 <= s for s in shape) or len(shape) > 4:
        raise WireError(f"bad tensor shape {shape!r}")
    elements = 1
    for s in shape:
        elements *= s
    if elements > MAX_ELEMENTS:
        raise WireError(f"tensor of {elements} elements is too large")
    dt = DTYPES[dtype]
    if n != elements * dt.itemsize:
        raise WireError(f"tensor data is {n} bytes, shape {shape} of {dtype} needs {elements * dt.itemsize}")
    return dt, shape
