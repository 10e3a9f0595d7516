"""Tensors on the wire: a map of dtype name, shape and raw bytes inside a CBOR frame; no pickle.

bfloat16 has no numpy dtype, so its bytes travel as int16 of the same width.
"""
from __future__ import annotations

import torch

from .wire import WireError

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int64": torch.int64}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}  # dtype names, on the wire and in --dtype, mean these


def pack_tensor(t: torch.Tensor, wire_dtype: torch.dtype | None = None) -> dict:
    t = t.detach()
    if wire_dtype is not None and t.dtype != wire_dtype:
        t = t.to(wire_dtype)
    t = t.contiguous().cpu()
    # bfloat16 has no numpy dtype: move its bytes as int16, which has the same width
    raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
    return {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape), "data": raw.numpy().tobytes()}


def unpack_tensor(d: object, max_elements: int = 1 << 28) -> torch.Tensor:
    if not isinstance(d, dict):
        raise WireError("tensor must be a map")
    dtype, shape, data = d.get("dtype"), d.get("shape"), d.get("data")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise WireError(f"unknown tensor dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(s, int) and 0 <= s for s in shape) or len(shape) > 4:
        raise WireError(f"bad tensor shape {shape!r}")
    if not isinstance(data, bytes):
        raise WireError("tensor data must be bytes")
    n = 1
    for s in shape:
        n *= s
    if n > max_elements:
        raise WireError(f"tensor of {n} elements is too large")
    dt = DTYPES[dtype]
    if len(data) != n * dt.itemsize:
        raise WireError(f"tensor data is {len(data)} bytes, shape {shape} of {dtype} needs {n * dt.itemsize}")
    if n == 0:
        return torch.empty(shape, dtype=dt)
    # frombuffer shares the bytes (no copy); the bytes object is immutable, so copy once to get a writable tensor
    flat = torch.frombuffer(bytearray(data), dtype=torch.int16 if dt == torch.bfloat16 else dt)
    if dt == torch.bfloat16:
        flat = flat.view(torch.bfloat16)
    return flat.reshape(shape)
