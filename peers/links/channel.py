"""A message channel over one trio stream: whole frames out, whole frames in through wire.FrameDecoder (its size
checked before the body is read). A frame's raw bytes go out from where they lie and come in straight into the
buffer the receiver gives them (on a plain socket, recv_into: no copy in between)."""
from __future__ import annotations

import socket

import trio

from peers.wire import codec as wire

SMALL = 64 * 1024  # raw bytes up to this go out in the same send as their header
READ_TIMEOUT = 30.0  # a silent connection cannot hold a slot for longer than this


class ChannelClosed(Exception):
    """The other side went away (or broke the protocol and was dropped)."""


class Channel:
    def __init__(self, stream: trio.abc.Stream, name: str = "?", read_timeout: float = READ_TIMEOUT,
                 max_frame: int = wire.MAX_FRAME):
        self.stream = stream
        self.name = name
        self.read_timeout = read_timeout
        self.decoder = wire.FrameDecoder(max_frame)
        self.send_lock = trio.Lock()
        set_nodelay(stream)

    async def send(self, msg: dict) -> None:
        head, raw = wire.frame(msg)
        if raw is not None and len(raw) <= SMALL:
            head, raw = head + raw, None
        async with self.send_lock:
            try:
                await self.stream.send_all(head)
                if raw is not None:
                    await self.stream.send_all(raw)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
                raise ChannelClosed(f"{self.name}: {e}") from None

    async def recv(self, timeout: float | None = None, into=None) -> dict:
        """The next message; raises ChannelClosed on EOF or timeout, WireError on a malformed frame.

        `into(msg, n)`: the buffer for a message's n raw bytes, once its body is read and before they are (it may
        check the message and raise WireError); else a new bytearray. It reads no further than the end of that
        frame, so a stream handed on after a message (a relay's "connected") keeps every byte that follows."""
        limit = self.read_timeout if timeout is None else timeout
        dec = self.decoder
        dec.into = into
        with trio.move_on_after(limit):
            while True:
                try:
                    if (place := dec.landing()) is not None:
                        n = await self._receive_into(place)
                        msgs = [] if (msg := dec.landed(n)) is None else [msg]
                    else:
                        chunk = await self.stream.receive_some(min(dec.needed(), 1 << 20))
                        n, msgs = len(chunk), dec.feed(chunk) if chunk else []
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
                    raise ChannelClosed(f"{self.name}: {e}") from None
                if not n:
                    raise ChannelClosed(f"{self.name}: connection closed")
                if msgs:
                    return msgs[0]
        raise ChannelClosed(f"{self.name}: no message within {limit:.0f} s")

    async def _receive_into(self, place: memoryview) -> int:
        if isinstance(self.stream, trio.SocketStream):
            return await self.stream.socket.recv_into(place)
        chunk = await self.stream.receive_some(min(len(place), 1 << 20))  # TLS: decrypted into a new chunk
        place[: len(chunk)] = chunk
        return len(chunk)

    async def error(self, text: str) -> None:
        """Tell the other side what went wrong, then close."""
        try:
            with trio.move_on_after(2):
                await self.send({"t": "error", "error": text})
        except ChannelClosed:
            pass
        await self.aclose()

    async def aclose(self) -> None:
        with trio.move_on_after(1):
            try:
                await self.stream.aclose()
            except Exception:
                pass


def set_nodelay(stream: trio.abc.Stream) -> None:
    sock = getattr(getattr(stream, "transport_stream", stream), "socket", None)
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def parse_addr(addr: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address must be HOST:PORT, got {addr!r}")
    return (host.strip("[]") or default_host), int(port)


def peername(stream) -> str:
    """HOST:PORT of the other end, for logs ("?" when unknown)."""
    try:
        h, p = getattr(stream, "transport_stream", stream).socket.getpeername()[:2]
        return f"{h}:{p}"
    except Exception:
        return "?"
