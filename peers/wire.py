"""The wire codec: length-prefixed CBOR frames (tensors inside them: see tensors.py).

Pure: bytes in, messages out. No I/O here, so it is tested alone; no torch either, so the relay stays light.
A frame is a 4-byte big-endian body length followed by a CBOR map with a string "t" (its type).
"""
from __future__ import annotations

import struct

import cbor2

MAX_FRAME = 64 * 1024 * 1024  # a [1, 4096, 8192] fp16 activation fits; anything bigger is hostile
MAX_DEPTH = 16
HEADER = struct.Struct(">I")


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

    def needed(self) -> int:
        """Bytes still missing from the next frame (its header first): a reader that asks for no more never
        takes a byte that follows the frame."""
        if len(self.buf) < HEADER.size:
            return HEADER.size - len(self.buf)
        return HEADER.size + frame_length(bytes(self.buf[: HEADER.size]), self.limit) - len(self.buf)
