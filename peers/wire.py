"""The wire codec: length-prefixed CBOR frames, tensors as dtype + shape + raw bytes.

Pure: bytes in, messages out. No I/O here, so it is tested alone.
A frame is a 4-byte big-endian body length followed by a CBOR map with a string "t" (its type).
"""
from __future__ import annotations

import struct

import cbor2
import torch

MAX_FRAME = 64 * 1024 * 1024  # a [1, 4096, 8192] fp16 activation fits; anything bigger is hostile
MAX_DEPTH = 16
HEADER = struct.Struct(">I")

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int64": torch.int64}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


class WireError(ValueError):
    """A frame or message that breaks the protocol."""


def encode(msg: dict) -> bytes:
    body = cbor2.dumps(msg)
    if len(body) > MAX_FRAME:
        raise WireError(f"frame of {len(body)} bytes exceeds {MAX_FRAME}")
    return HEADER.pack(len(body)) + body


def frame_length(header: bytes, limit: int = MAX_FRAME) -> int:
    """The body length announced by a 4-byte header, checked before any body byte is read."""
    (n,) = HEADER.unpack(header)
    if n > limit:
        raise WireError(f"frame of {n} bytes exceeds the {limit}-byte limit")
    return n


def decode_body(body: bytes) -> dict:
    try:
        msg = cbor2.loads(body, max_depth=MAX_DEPTH, allow_indefinite=False)
    except Exception as e:  # cbor2 raises several types; all mean the same to us
        raise WireError(f"bad CBOR: {e}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("t"), str):
        raise WireError("a message must be a map with a string 't'")
    return msg


class FrameDecoder:
    """Feed bytes, take whole messages. Used by streams and by tests on raw byte soup."""

    def __init__(self, limit: int = MAX_FRAME):
        self.limit = limit
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[dict]:
        self.buf += data
        out = []
        while len(self.buf) >= HEADER.size:
            n = frame_length(bytes(self.buf[: HEADER.size]), self.limit)
            if len(self.buf) < HEADER.size + n:
                break
            body = bytes(self.buf[HEADER.size : HEADER.size + n])
            del self.buf[: HEADER.size + n]
            out.append(decode_body(body))
        return out


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
