"""The wire codec: length-prefixed CBOR frames, and raw bytes after them (tensors: see tensors.py).

Pure: bytes in, messages out. No I/O here, so it is tested alone; no torch either, so the relay stays light.
A frame is a 4-byte big-endian body length followed by a CBOR map with a string "t" (its type). A map with
"raw": N is followed by N raw bytes (a tensor's, say), which never pass through CBOR: in memory, a message's
"raw" is those bytes (any buffer), on the wire their count. Body and raw bytes together fit MAX_FRAME.
"""
from __future__ import annotations

import struct

import cbor2

MAX_FRAME = 64 * 1024 * 1024  # a [1, 4096, 8192] fp16 activation fits; anything bigger is hostile
MAX_DEPTH = 16
HEADER = struct.Struct(">I")


class WireError(ValueError):
    """A frame or message that breaks the protocol."""


def frame(msg: dict) -> tuple[bytes, memoryview | None]:
    """The frame of `msg` in two parts: its header and body, and its raw bytes as they lie in memory (no copy)."""
    raw = msg.get("raw")
    if not isinstance(raw, (bytes, bytearray, memoryview)):  # absent, or a count already (tests write lying ones)
        return _head(msg, 0), None
    payload = memoryview(raw).cast("B")
    return _head({**msg, "raw": payload.nbytes}, payload.nbytes), payload


def encode(msg: dict) -> bytes:
    """The whole frame of `msg` in one piece."""
    head, payload = frame(msg)
    return head if payload is None else head + payload


def _head(msg: dict, raw: int) -> bytes:
    body = cbor2.dumps(msg)
    if len(body) + raw > MAX_FRAME:
        raise WireError(f"frame of {len(body) + raw} bytes exceeds {MAX_FRAME}")
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


def raw_length(msg: dict, room: int) -> int | None:
    """How many raw bytes follow this message's body (None: none), checked against the room the frame has left."""
    n = msg.get("raw")
    if n is None:
        return None
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise WireError(f"{msg['t']}: 'raw' must be a byte count")
    if n > room:
        raise WireError(f"{msg['t']}: {n} raw bytes exceed the frame's limit")
    return n


class FrameDecoder:
    """Feed bytes, take whole messages. Used by streams and by tests on raw byte soup.

    A message's raw bytes land in a buffer of their own, from `into(msg, n)` (a caller that checked the message
    and knows where its n bytes belong), or a new bytearray. A stream may fill that buffer itself (landing,
    landed): the bytes then go from the socket to their place with no copy in between."""

    def __init__(self, limit: int = MAX_FRAME, into=None):
        self.limit = limit
        self.into = into
        self.buf = bytearray()
        self.msg: dict | None = None  # a message whose raw bytes are arriving
        self.raw = memoryview(b"")
        self.got = 0

    def feed(self, data: bytes) -> list[dict]:
        out = []
        while True:
            if self.msg is not None:  # the raw bytes of the message decoded last
                n = min(len(data), len(self.raw) - self.got)
                self.raw[self.got : self.got + n] = data[:n]
                data = data[n:]
                msg = self.landed(n)
                if msg is None:
                    return out
                out.append(msg)
                continue
            self.buf += data
            if len(self.buf) < HEADER.size:
                return out
            n = frame_length(bytes(self.buf[: HEADER.size]), self.limit)
            if len(self.buf) < HEADER.size + n:
                return out
            msg = decode_body(bytes(self.buf[HEADER.size : HEADER.size + n]))
            data = bytes(self.buf[HEADER.size + n :])
            self.buf.clear()
            if (msg := self._start(msg, n)) is not None:
                out.append(msg)

    def _start(self, msg: dict, body: int) -> dict | None:
        n = raw_length(msg, self.limit - body)
        if n is None:
            return msg
        buf = self.into(msg, n) if self.into is not None else bytearray(n)
        self.msg, self.raw, self.got = msg, memoryview(buf).cast("B"), 0
        if len(self.raw) != n:
            raise WireError(f"{msg['t']}: a buffer of {len(self.raw)} bytes for {n} raw bytes")
        return self.landed(0)

    def landing(self) -> memoryview | None:
        """Where the next raw bytes belong (a stream may read straight into it); None while a header or a body is
        due."""
        return self.raw[self.got :] if self.msg is not None else None

    def landed(self, n: int) -> dict | None:
        """n more raw bytes are in place; the message once all of them are."""
        self.got += n
        if self.got < len(self.raw):
            return None
        msg, msg["raw"] = self.msg, self.raw
        self.msg, self.raw = None, memoryview(b"")
        return msg

    def needed(self) -> int:
        """Bytes still missing from the next frame (its header first): a reader that asks for no more never
        takes a byte that follows the frame."""
        if self.msg is not None:
            return len(self.raw) - self.got
        if len(self.buf) < HEADER.size:
            return HEADER.size - len(self.buf)
        return HEADER.size + frame_length(bytes(self.buf[: HEADER.size]), self.limit) - len(self.buf)
