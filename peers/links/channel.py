"""A message channel over one trio stream: whole frames out, whole frames in through wire.FrameDecoder (its size
checked before the body is read). A frame's raw bytes go out from where they lie and come in straight into the
buffer the receiver gives them (on a plain socket, recv_into: no copy in between)."""
from __future__ import annotations

import math
import os
import socket
import time
from collections import deque

import trio

from peers.base.stalls import STALLS
from peers.wire import codec as wire

SMALL = 64 * 1024  # raw bytes up to this go out in the same send as their header
READ_TIMEOUT = 30.0  # a silent connection cannot hold a slot for longer than this
# a send that makes no progress for this long, plus its bytes at this rate, has hung: the other side stopped reading
SEND_S, SEND_RATE = 20.0, 256 * 1024
# the kernel's own deadlines, so a peer gone without a FIN or RST (a cut cable, a machine asleep) is noticed even on
# an idle link: keepalive probes after KEEPALIVE_S of silence, one a second, KEEPALIVE_PROBES unanswered ends it;
# data unacknowledged for USER_TIMEOUT_S ends it too
KEEPALIVE_S, KEEPALIVE_PROBES = 5, 3
USER_TIMEOUT_S = 10.0
# how long a link carrying passes may sit idle before its reader looks again (it stays up: a ring idle for hours
# answers its next prompt at once; the kernel's keepalive, not this, says when the other side is gone). Tests
# shorten it (SFCHAT_LINK_IDLE_S) to show exactly that.
def idle_s() -> float:
    return float(os.environ.get("SFCHAT_LINK_IDLE_S") or 3600)


MAX_STRETCH = 2.0


class Arrivals:
    """The gaps between arrivals on a link kept alive (peers/links/liveness.py), as phi-accrual failure detectors
    (Cassandra, Akka) keep them: silence becomes death once it is improbable given those gaps, never before a
    floor. A link whose other end is loaded, and so sends late, gets a longer limit; a quiet one keeps the floor."""

    def __init__(self):
        self.last = time.monotonic()
        self.gaps: deque[float] = deque(maxlen=64)

    def heard(self) -> None:
        now = time.monotonic()
        if not STALLS.within(now - self.last, now):  # (a gap across our own stall says nothing of the link)
            self.gaps.append(now - self.last)
        self.last = now

    def limit(self, floor: float) -> float:
        """floor, or the mean gap plus 8 standard deviations where that is longer (phi ~ 15 under a normal law),
        at most MAX_STRETCH times the floor (a cut link is still found in seconds)."""
        if len(self.gaps) < 8:
            return floor
        mean = sum(self.gaps) / len(self.gaps)
        sd = (sum((g - mean) ** 2 for g in self.gaps) / len(self.gaps)) ** 0.5
        return min(max(floor, mean + 8 * sd), MAX_STRETCH * floor)


class ChannelClosed(Exception):
    """The other side went away (or broke the protocol and was dropped)."""


class ChannelIdle(ChannelClosed):
    """Nothing came within the read timeout; the link is intact (a reader may simply read on)."""


class Channel:
    def __init__(self, stream: trio.abc.Stream, name: str = "?", read_timeout: float = READ_TIMEOUT,
                 max_frame: int = wire.MAX_FRAME):
        self.stream = stream
        self.name = name
        self.read_timeout = read_timeout
        self.decoder = wire.FrameDecoder(max_frame)
        self.send_lock = trio.Lock()
        self.between_bytes = False  # True: read_timeout is silence between bytes, not the time to a whole message
        self.last_sent = 0.0  # trio's clock (peers/links/liveness.py: a data link's writer keeps it alive)
        self.kept_alive = False  # a keepalive came on it: a ring member's link, not merely someone with the token
        self.closed = False
        self.arrivals = Arrivals()  # between_bytes: the gaps between what came, for the silence that means death
        self.excused = lambda: False  # between_bytes: True while this side's silence is not the link's fault
        self.reading_since: float | None = None  # when recv began waiting (None: nobody is reading)
        tune(stream)

    async def send(self, msg: dict, timeout: float | None = None) -> None:
        """Send one message; ChannelClosed if the link is gone or the send hangs past its deadline (SEND_S plus
        its bytes at SEND_RATE, unless `timeout`): then the link is closed, half a frame never goes on."""
        head, raw = wire.frame(msg)
        if raw is not None and len(raw) <= SMALL:
            head, raw = head + raw, None
        limit = timeout if timeout is not None else SEND_S + (len(head) + len(raw or b"")) / SEND_RATE
        async with self.send_lock:
            with trio.move_on_after(limit) as scope:
                try:
                    await self.stream.send_all(head)
                    if raw is not None:
                        await self.stream.send_all(raw)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
                    raise ChannelClosed(f"{self.name}: {e}") from None
            if scope.cancelled_caught:
                self.closed = True
                await trio.aclose_forcefully(self.stream)
                raise ChannelClosed(f"{self.name}: a send made no progress for {limit:.0f} s")
            self.last_sent = trio.current_time()

    async def recv(self, timeout: float | None = None, into=None) -> dict:
        """The next message; raises ChannelClosed on EOF or timeout, WireError on a malformed frame.

        `into(msg, n)`: the buffer for a message's n raw bytes, once its body is read and before they are (it may
        check the message and raise WireError); else a new bytearray. It reads no further than the end of that
        frame, so a stream handed on after a message (a relay's "connected") keeps every byte that follows."""
        limit = self.read_timeout if timeout is None else timeout
        floor = limit = math.inf if limit is None else limit
        dec = self.decoder
        dec.into = into
        self.reading_since = time.monotonic()
        try:
            return await self._recv(limit, floor, dec)
        finally:
            self.reading_since = None

    def silent_for(self) -> float:
        """How long its reader has waited without a byte: 0 while nobody reads (a reader that stopped to compute
        what came is no silence of the link's)."""
        if self.reading_since is None:
            return 0.0
        return time.monotonic() - max(self.reading_since, self.arrivals.last)

    async def _recv(self, limit: float, floor: float, dec) -> dict:
        while True:
            if self.between_bytes:
                limit = self.arrivals.limit(floor)
            with trio.move_on_after(limit) as scope:
                while True:
                    if self.between_bytes:
                        scope.deadline = trio.current_time() + limit
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
                    if self.between_bytes:
                        self.arrivals.heard()
                    if msgs:
                        return msgs[0]
            # silence past the limit: the other side's, unless this process was itself not running meanwhile, or
            # the one who would speak here is silent everywhere (`excused`: a host paused, not a link cut)
            if not self.between_bytes or not (STALLS.within(limit) or self.excused()):
                raise ChannelIdle(f"{self.name}: no message within {limit:.1f} s")
            self.arrivals.last = time.monotonic()  # a fresh grace period (the gap is no measure of the link)

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
        self.closed = True
        with trio.move_on_after(1):
            try:
                await self.stream.aclose()
            except Exception:
                pass


def tune(stream: trio.abc.Stream) -> None:
    """TCP_NODELAY (a frame goes at once), keepalive and TCP_USER_TIMEOUT (a peer gone silently is noticed in
    seconds, not after the kernel's two hours or fifteen minutes) on a TCP stream's socket."""
    sock = getattr(getattr(stream, "transport_stream", stream), "socket", None)
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_S), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", KEEPALIVE_PROBES),
                        ("TCP_USER_TIMEOUT", int(USER_TIMEOUT_S * 1000))):
        if hasattr(socket, name):  # (Linux names them all; macOS lacks some)
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


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
