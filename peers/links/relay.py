"""The relay behind `sfchat relay`: a rendezvous that splices TCP connections between named endpoints, and only forwards bytes.

Every connection to the relay starts with one wire frame saying what it is:
  register{name}  an endpoint's control link; the relay answers registered, then sends incoming{id} for each
                  dialer and answers the endpoint's pings with pongs. The name is free while this link lives.
  dial{name}      a dialer; the relay tells the endpoint incoming{id} and waits for it to accept.
  accept{id}      the endpoint's fresh connection for that dialer; both sides get connected, then the relay
                  splices the two sockets: from here on it copies bytes (optionally shaped) and reads none.
Authentication stays end to end (the HMAC handshake runs over the spliced bytes): the relay never sees the
token, so it cannot join a ring, and a stranger who takes a name only gets handshakes that fail.
"""
from __future__ import annotations

import logging
import re
import secrets
import time
from dataclasses import dataclass, field
from functools import partial

import trio

from peers.wire import codec as wire
from peers.links.channel import Channel, ChannelClosed, parse_addr, peername
from peers.links.shaping import Shaping, pump
from peers.links.tls import Endpoint as TLSEndpoint

log = logging.getLogger("sfchat.relay")

HELLO_TIMEOUT = 10.0  # a connection must say what it is within this
ACCEPT_TIMEOUT = 10.0  # an endpoint must accept a dialer within this
KEEPALIVE_TIMEOUT = 60.0  # an endpoint silent for this long (no ping) is dropped
MAX_REQUEST = 4096  # the relay's own frames are tiny; nobody makes it buffer a big one
NAME = re.compile(r"[A-Za-z0-9._-]{1,64}(/[A-Za-z0-9._-]{1,64}){0,3}")


@dataclass
class Pending:
    """A dialer waiting for its endpoint to accept."""

    name: str
    accepted: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)
    ch: Channel | None = None


@dataclass
class Spliced:
    """A live spliced connection: to endpoint `name`; cut() cancels `scope`."""

    name: str
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    hole: bool = False  # cut as a blackhole: both sockets stay open and nothing moves (no FIN, no RST)


class Relay:
    def __init__(self, shaping: Shaping | None = None, tls: bool = False):
        self.shaping = shaping or Shaping()
        self.tls = TLSEndpoint(tls, "relay")  # --tls: even the rendezvous is encrypted (pinned by fingerprint)
        self.endpoints: dict[str, Channel] = {}
        self.pending: dict[str, Pending] = {}
        self.address = ""
        self.splices = 0  # live spliced connections
        self.spliced: dict[str, Spliced] = {}  # by id: what cut() finds

    async def serve(self, listen: str = "127.0.0.1:0", task_status=trio.TASK_STATUS_IGNORED) -> None:
        host, port = parse_addr(listen)
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, self._handle, port, host=host or None))
            h, p = listeners[0].socket.getsockname()[:2]
            pin = f"{self.tls.fingerprint}@" if self.tls.enabled else ""
            self.address = f"{pin}{h}:{p}"
            log.debug("relay on %s (%s)", self.address, self.shaping)  # (`sfchat relay` prints it, once)
            task_status.started(self.address)

    async def _handle(self, stream: trio.SocketStream) -> None:
        who = peername(stream)
        try:
            stream = await self.tls.accept(stream)
        except (OSError, trio.BrokenResourceError, trio.TooSlowError) as e:
            return log.info("%s: TLS handshake failed: %s", who, e)
        ch = Channel(stream, who, max_frame=MAX_REQUEST)  # also sets TCP_NODELAY
        try:
            msg = await ch.recv(HELLO_TIMEOUT)
            kind = msg["t"]
            if kind == "register":
                await self._register(ch, msg, who)
            elif kind == "dial":
                await self._dial(ch, msg, who)
            elif kind == "accept":
                await self._accept(ch, msg, who)
            else:
                await ch.error(f"unknown request {kind!r}")
        except (ChannelClosed, wire.WireError, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            log.info("%s: %s", who, e)
        except Exception:  # one bad client never takes the relay down
            log.exception("%s: unexpected error", who)

    async def _register(self, ch: Channel, msg: dict, who: str) -> None:
        name = msg.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            return await ch.error("an endpoint name is 1-4 parts of [A-Za-z0-9._-] joined by /")
        if name in self.endpoints:
            return await ch.error(f"endpoint {name} is taken")
        self.endpoints[name] = ch
        log.info("%s registered %s", who, name)
        try:
            await ch.send({"t": "registered", "name": name})
            while True:
                m = await ch.recv(KEEPALIVE_TIMEOUT)
                if m["t"] != "ping":
                    raise wire.WireError(f"unexpected {m['t']!r} on a control link")
                await ch.send({"t": "pong"})
        finally:
            if self.endpoints.get(name) is ch:
                del self.endpoints[name]
            log.info("endpoint %s is gone", name)

    async def _dial(self, ch: Channel, msg: dict, who: str) -> None:
        name = msg.get("name")
        ep = self.endpoints.get(name) if isinstance(name, str) else None
        if ep is None:
            log.info("%s dialed %r: no such endpoint", who, name)
            return await ch.error(f"no endpoint {name!r} on this relay")
        cid = secrets.token_hex(8)  # unguessable: only the endpoint, told on its control link, can accept
        p = self.pending[cid] = Pending(name)
        try:
            try:
                await ep.send({"t": "incoming", "id": cid})
            except ChannelClosed:
                return await ch.error(f"endpoint {name} is gone")
            with trio.move_on_after(ACCEPT_TIMEOUT):
                await p.accepted.wait()
            if p.ch is None:
                return await ch.error(f"endpoint {name} did not accept")
            await ch.send({"t": "connected"})
            await p.ch.send({"t": "connected"})
            log.info("%s -> %s connected [%s]", who, name, cid)
            t0, counts = time.monotonic(), [0, 0]
            self.splices += 1
            link = self.spliced[cid] = Spliced(name)
            try:
                with link.scope:
                    await splice(ch.stream, p.ch.stream, self.shaping, counts)
                if link.hole:  # a partition: the connection looks alive to both ends, and carries nothing
                    await trio.sleep_forever()
            finally:
                self.splices -= 1
                del self.spliced[cid]
                log.info("%s -> %s closed [%s] after %.1f s, %d bytes out, %d back", who, name, cid,
                         time.monotonic() - t0, counts[0], counts[1])
        finally:
            self.pending.pop(cid, None)
            p.done.set()

    async def _accept(self, ch: Channel, msg: dict, who: str) -> None:
        p = self.pending.get(msg.get("id")) if isinstance(msg.get("id"), str) else None
        if p is None or p.ch is not None:
            return await ch.error("no such incoming connection")
        p.ch = ch
        p.accepted.set()
        await p.done.wait()  # the dialer's task splices; this stream must stay open until it is done


    def cut(self, name: str, hole: bool = False) -> int:
        """(tests, the soak) End every live connection to endpoint `name`: closed (both ends get a FIN), or as
        a blackhole (`hole`: open, silent, as a cut cable or a sleeping machine looks). How many were cut."""
        links = [link for link in self.spliced.values() if link.name == name and not link.scope.cancel_called]
        for link in links:
            link.hole = hole
            link.scope.cancel()
        return len(links)


async def splice(a: trio.abc.Stream, b: trio.abc.Stream, shaping: Shaping, counts: list[int]) -> None:
    """Copy both ways until both sides are done; a broken side tears down both. counts: [a->b, b->a] bytes."""
    async with trio.open_nursery() as nursery:
        for i, (src, dst) in enumerate(((a, b), (b, a))):
            nursery.start_soon(_direction, src, dst, shaping, counts, i, nursery.cancel_scope)


async def _direction(src, dst, shaping: Shaping, counts: list[int], i: int, both: trio.CancelScope) -> None:
    def count(n: int) -> None:
        counts[i] += n

    try:
        await pump(src, dst, shaping, count)
        if isinstance(dst, trio.SSLStream):  # TLS cannot half-close: one side's end ends the splice
            both.cancel()
        else:
            await dst.send_eof()  # a clean end: half-close, the other direction may still be talking
    except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        both.cancel()
