"""Dial and listen by address: `HOST:PORT` directly, or `relay://RHOST:RPORT/ENDPOINT` through a relay.

To be reachable through a relay, a process keeps a control link to it registering an endpoint name; for each
dialer the relay names, it opens a fresh connection to the relay, which splices the two (see relay.py). Either
way the handler gets a plain trio stream, and whatever runs over it (the HMAC handshake first) is end to end.
Ring endpoints are named `<ring-id>/host` and `<ring-id>/<member>-<random>`; the ring id is random, never
derived from the token.
"""
from __future__ import annotations

import errno
import logging
import re
import secrets
from dataclasses import dataclass
from functools import partial

import trio

from peers.wire import codec as wire
from peers.links.channel import Channel, ChannelClosed, parse_addr
from peers.links.tls import Endpoint as TLSEndpoint

log = logging.getLogger("sfchat.links")

SCHEME = "relay://"
DIAL_TIMEOUT = 15.0  # the relay gives the endpoint 10 s to accept
PING_S = 15.0  # keepalive on an endpoint's control link; the relay drops one silent for 60 s
RETRY_MAX_S = 10.0
CONNECT_S = 5.0  # a TCP connect that takes longer goes nowhere (a host gone, a packet filter that drops)


class LinkError(OSError):
    """A relayed connection that could not be made (no relay, no such endpoint, refused)."""


@dataclass
class Listening:
    port: int  # the direct TCP port (0: none)
    relay_address: str  # relay://… where the relay reaches us ("" if not through a relay)


def is_relay(addr: str) -> bool:
    return addr.startswith(SCHEME)


def parse_relay(addr: str) -> tuple[str, str]:
    """relay://RHOST:RPORT/ENDPOINT -> ("RHOST:RPORT", "ENDPOINT")."""
    relay, sep, name = addr[len(SCHEME):].partition("/")
    if not is_relay(addr) or not sep or not name:
        raise ValueError(f"a relay address is relay://HOST:PORT/ENDPOINT, got {addr!r}")
    parse_addr(relay.rpartition("@")[2])
    return relay, name


def relay_address(relay: str, name: str) -> str:
    return f"{SCHEME}{relay}/{name}"


def host_endpoint() -> str:
    return f"{secrets.token_hex(5)}/host"


def member_endpoint(host_addr: str, name: str) -> str:
    """A member's endpoint: under its ring's id when it joined through a relay, unique either way."""
    ring = parse_relay(host_addr)[1].partition("/")[0] if is_relay(host_addr) else secrets.token_hex(5)
    return f"{ring}/{re.sub(r'[^A-Za-z0-9._-]', '-', name)[:40] or 'peer'}-{secrets.token_hex(3)}"


def relay_of(host_addr: str, relay: str | None) -> str | None:
    """The relay a member registers with: --relay, else the relay its host address goes through."""
    return relay or (parse_relay(host_addr)[0] if is_relay(host_addr) else None)


def host_return(host_addr: str, host_port: int) -> str:
    """The last member's way back to the host ("@host"): its relay endpoint serves data too, as its port does."""
    return host_addr if is_relay(host_addr) else f"{parse_addr(host_addr)[0]}:{host_port}"


async def open_relay(relay: str) -> trio.abc.Stream:
    """A connection to a relay: `HOST:PORT`, or `FINGERPRINT@HOST:PORT` for a `--tls` relay (pinned)."""
    pin, _, hostport = relay.rpartition("@")
    stream = await connect(hostport)
    try:
        return await TLSEndpoint.dial(stream, pin or None, plain=f"the relay {hostport} does not use TLS: drop "
                                      f"the fingerprint and '@' before its address")
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise


async def connect(addr: str) -> trio.SocketStream:
    """A TCP stream to HOST:PORT, or OSError within CONNECT_S."""
    with trio.move_on_after(CONNECT_S):
        return await trio.open_tcp_stream(*parse_addr(addr))
    raise LinkError(f"cannot connect to {addr}: no answer within {CONNECT_S:.0f} s")


async def dial(addr: str) -> trio.SocketStream:
    """A stream to `addr`, direct or through a relay; raises OSError (LinkError) when it cannot be made."""
    if not is_relay(addr):
        return await connect(addr)
    relay, name = parse_relay(addr)
    stream = await open_relay(relay)
    try:
        ch = Channel(stream, f"relay {relay}")
        await ch.send({"t": "dial", "name": name})
        msg = await ch.recv(timeout=DIAL_TIMEOUT)
    except (ChannelClosed, wire.WireError) as e:
        await trio.aclose_forcefully(stream)
        raise LinkError(f"relay {relay}: {e}") from None
    if msg["t"] != "connected":
        await trio.aclose_forcefully(stream)
        raise LinkError(f"relay {relay}: {msg.get('error', msg['t'])}")
    return stream


async def serve(handler, listen: str | None, relay: str | None = None, name: str | None = None, *,
                default_host: str = "127.0.0.1", task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Hand every incoming stream to `handler`: accepted directly on `listen` and/or through `relay` as `name`.

    Starts with a Listening; like trio.serve_tcp, each stream is closed when its handler returns."""
    async with trio.open_nursery() as nursery:
        port, addr = 0, ""
        if listen:
            host, p = parse_addr(listen, default_host)
            try:
                listeners = await nursery.start(partial(trio.serve_tcp, handler, p, host=host or None))
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    raise
                busy = OSError(f"cannot listen on {host}:{p}: the address is in use (another sfchat?); "
                               f"pick another port, e.g. --listen {host}:{p + 1}")
                busy.errno = e.errno
                raise busy from None
            port = listeners[0].socket.getsockname()[1]
        if relay:
            addr = await nursery.start(_through_relay, handler, relay, name or host_endpoint(), nursery)
        task_status.started(Listening(port, addr))


async def _through_relay(handler, relay: str, name: str, nursery, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Keep `name` registered on `relay` (re-registering if the relay drops us); accept each incoming dialer."""
    started, wait = False, 1.0
    while True:
        error, stream = None, None
        try:
            stream = await open_relay(relay)
            ctl = Channel(stream, f"relay {relay}")
            await ctl.send({"t": "register", "name": name})
            msg = await ctl.recv(timeout=10)
            if msg["t"] != "registered":
                raise LinkError(f"relay {relay} refused {name}: {msg.get('error', msg['t'])}")
            if not started:
                task_status.started(relay_address(relay, name))
                started = True
            log.info("reachable as %s", relay_address(relay, name))
            wait = 1.0
            async with trio.open_nursery() as pings:
                pings.start_soon(_keepalive, ctl)
                while True:
                    msg = await ctl.recv(timeout=3 * PING_S)  # incoming or pong; silence means the relay is gone
                    if msg["t"] == "incoming" and isinstance(msg.get("id"), str):
                        nursery.start_soon(_accept, handler, relay, msg["id"])  # outlives this control link
        except* (OSError, ChannelClosed, wire.WireError) as group:
            error = _first(group)
        finally:
            if stream is not None:
                await trio.aclose_forcefully(stream)
        if not started:
            raise LinkError(f"cannot register {name} on relay {relay}: {error}")
        log.warning("lost relay %s (%s); retrying in %.0f s", relay, error, wait)
        await trio.sleep(wait)
        wait = min(wait * 2, RETRY_MAX_S)


def _first(e: BaseException) -> BaseException:
    while isinstance(e, BaseExceptionGroup):
        e = e.exceptions[0]
    return e


async def _keepalive(ctl: Channel) -> None:
    try:
        while True:
            await trio.sleep(PING_S)
            await ctl.send({"t": "ping"})
    except ChannelClosed:
        pass  # the reader notices too


async def _accept(handler, relay: str, cid: str) -> None:
    """Open a fresh connection to the relay for dialer `cid`, then serve it like a directly accepted one."""
    try:
        stream = await open_relay(relay)
    except OSError as e:
        log.warning("cannot reach relay %s to accept a connection: %s", relay, e)
        return
    try:
        try:
            ch = Channel(stream, f"relay {relay}")
            await ch.send({"t": "accept", "id": cid})
            msg = await ch.recv(timeout=10)
        except (ChannelClosed, wire.WireError) as e:
            log.warning("relay %s: %s", relay, e)
            return
        if msg["t"] != "connected":
            log.warning("relay %s: %s", relay, msg.get("error", msg["t"]))
            return
        await handler(stream)
    finally:
        await trio.aclose_forcefully(stream)
