"""Bad input on the ring's ports: strangers sending garbage, truncated frames and huge lengths, and a member that
holds the token sending frames with wrong types, shapes, positions, session ids and raw-byte counts. Every
connection must end with at most an error frame and a hang-up, never be held open."""
from __future__ import annotations

import asyncio
import os
import random
import secrets
import struct
import time

import cbor2

from peers.wire import codec as wire
from peers.links.auth import NONCE, _proof

from .ring import Ring
from .tally import Tally

HANG_UP_S = 20.0  # the ring's handshake limit is 10 s; a port that holds a bad connection longer is noted


def raw_frame(obj) -> bytes:
    body = cbor2.dumps(obj)
    return struct.pack(">I", len(body)) + body


def garbage(rng: random.Random) -> tuple[bytes, bool]:
    """A stranger's bytes, and whether the sender then hangs up at once (else it waits to be hung up on)."""
    kind = rng.randrange(8)
    if kind == 0:
        return os.urandom(rng.randrange(1, 4096)), False
    if kind == 1:
        return struct.pack(">I", rng.randrange(wire.MAX_FRAME + 1, 2**32)) + os.urandom(64), False  # a huge length
    if kind == 2:
        return raw_frame({"t": "hello", "role": "data", "nonce": os.urandom(NONCE)})[:-rng.randrange(1, 20)], True
    if kind == 3:
        return raw_frame({"t": "hello", "role": "join", "nonce": b"short"}), False
    if kind == 4:
        return raw_frame(rng.choice([[1, 2, 3], "hello", None, {"t": 7}, {"x": 1}])), False
    if kind == 5:
        return raw_frame({"t": "auth", "proof": os.urandom(32)}), False
    if kind == 6:
        return b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", False
    return struct.pack(">I", rng.randrange(100, 10000)) + os.urandom(rng.randrange(0, 50)), True  # cut short


def bad_fwd(rng: random.Random, hidden: int, epoch: int) -> dict:
    """A frame a buggy member might send: something about it wrong, or valid but of no conversation."""
    t = rng.choice([1, 1, 2, 3])
    ok = dict(t="fwd", epoch=epoch, sid=f"soak-{rng.randrange(10**6)}", seq=rng.randrange(100), committed=0,
              n_logits=1, trace=[])

    def x(shape, dtype="float32", size=4):
        n = 1
        for s in shape:
            n *= s
        return {"x": {"dtype": dtype, "shape": shape}, "raw": bytes(max(n, 0) * size)}

    one = x([1, t, hidden])
    choices = [
        lambda: {"t": rng.choice(["assign", "ping", "ready", "welcome", "hello", "", "fwd2", "x" * 300])},  # types
        lambda: ok | x([1, t, hidden + rng.choice([-1, 1, 7])]),  # shapes
        lambda: ok | x([t, hidden]),
        lambda: ok | x([2, t, hidden]),
        lambda: ok | {"x": {"dtype": "float32", "shape": [1, 0, hidden]}, "raw": b""},
        lambda: ok | x([1, t, hidden], "int64", 8),
        lambda: ok | {"x": {"dtype": "float32", "shape": [1, 9000, hidden]}} | {"raw": 4},
        lambda: ok | {"committed": rng.choice([-1, -5, 10**9, 2**70])} | one,  # positions
        lambda: ok | {"seq": -1} | one,
        lambda: ok | {"n_logits": rng.choice([-1, 10**6, "1"])} | one,
        lambda: ok | {"committed": rng.randrange(1, 500)} | one,  # positions nobody holds: a replay is asked for
        lambda: ok | {"sid": rng.choice([7, None, b"bytes", ["a"], "s" * 10000])} | one,  # session ids
        lambda: ok | {"batch": [{"sid": "a", "committed": 0, "n": t, "n_logits": 1}] * 2} | one,
        lambda: ok | {"batch": [{"sid": "a", "committed": 0, "n": t + 3, "n_logits": 1}]} | one,
        lambda: ok | {"parents": [5, 9]} | one,
        lambda: ok | {"trace": rng.choice(["nope", [0] * 100])} | one,
        lambda: ok | {"epoch": epoch + rng.choice([-1, 1, 10**6])} | one,  # an old or future plan
        lambda: ok | one,  # valid, of a conversation nobody has
        lambda: ok | {"x": {"dtype": "float32", "shape": [1, t, hidden]}, "raw": b"\0" * rng.randrange(0, 64)},  # raw
        lambda: ok | {"x": {"dtype": "float32", "shape": [1, t, hidden]}, "raw": rng.choice([-1, "many", 1.5])},
        lambda: ok | {"x": {"dtype": "float32", "shape": [1, t, hidden]}, "raw": wire.MAX_FRAME},
        lambda: {"t": "fail", "raw": b"\0" * 8},
        lambda: {"t": "fail", "epoch": epoch, "sid": f"soak-{rng.randrange(99)}", "seq": 0, "error": "x"},
        lambda: ok | {"x": "not a map"} | {"raw": b"\0" * 4},
    ]
    return rng.choice(choices)()


def encode(msg: dict) -> bytes:
    """The frame as a member would send it; a lying raw count is written as it is (no bytes follow)."""
    raw = msg.get("raw")
    if isinstance(raw, (bytes, bytearray)):
        return wire.encode(msg)
    return raw_frame(msg)


async def read_until_closed(reader: asyncio.StreamReader, limit_s: float) -> tuple[list[dict], bool]:
    """The frames the other side sent before hanging up, and whether it hung up in time."""
    dec, got = wire.FrameDecoder(), []
    try:
        async with asyncio.timeout(limit_s):
            while data := await reader.read(65536):
                try:
                    got += dec.feed(data)
                except wire.WireError:
                    pass
    except TimeoutError:
        return got, False
    except (ConnectionError, OSError):
        pass
    return got, True


async def recv(reader: asyncio.StreamReader, dec: wire.FrameDecoder) -> dict:
    while True:
        data = await reader.read(65536)
        if not data:
            raise ConnectionError("closed")
        if msgs := dec.feed(data):
            return msgs[0]


async def open_link(addr: str):
    """A connection to a ring port: HOST:PORT, or relay://HOST:PORT/ENDPOINT dialled as a peer dials it."""
    if not addr.startswith("relay://"):
        host, port = addr.rsplit(":", 1)
        return await asyncio.open_connection(host, int(port))
    relay, _, name = addr[len("relay://"):].partition("/")
    host, port = relay.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(wire.encode({"t": "dial", "name": name}))
    said = await asyncio.wait_for(recv(reader, wire.FrameDecoder()), 10)
    if said.get("t") != "connected":
        writer.close()
        raise ConnectionError(f"the relay said {said}")
    return reader, writer


async def authenticate(addr: str, token: str):
    """A data link that passed the handshake with the right token (peers/links/auth.py, client side)."""
    reader, writer = await open_link(addr)
    dec, nc = wire.FrameDecoder(), secrets.token_bytes(NONCE)
    writer.write(wire.encode({"t": "hello", "role": "data", "nonce": nc}))
    challenge = await recv(reader, dec)
    writer.write(wire.encode({"t": "auth", "proof": _proof(token, b"client", nc, challenge["nonce"])}))
    welcome = await recv(reader, dec)
    if welcome.get("t") != "welcome":
        raise ConnectionError(f"not welcomed: {welcome}")
    return reader, writer


def hung(tally: Tally, faults, since: float, what: str) -> None:
    """A bad connection held open, unless a fault was under way meanwhile (a stopped member answers nobody)."""
    if faults.overlapped(since, time.monotonic()):
        return
    tally.ring_held += 1
    tally.note(f"{what} was not hung up on within {HANG_UP_S:.0f} s")


async def stranger(addr: str, rng: random.Random, tally: Tally, faults) -> None:
    data, leave, since = *garbage(rng), time.monotonic()
    try:
        reader, writer = await open_link(addr)
    except (OSError, ConnectionError, asyncio.TimeoutError):
        return  # a member restarting: its port is gone
    tally.connections += 1
    tally.frames += 1
    try:
        writer.write(data)
        await writer.drain()
        if not leave:
            said, closed = await read_until_closed(reader, HANG_UP_S)
            if not closed:
                hung(tally, faults, since, f"garbage to {addr}")
            elif len(said) > 1 or any(m.get("t") != "error" for m in said):
                if not (said and said[0].get("t") == "challenge"):  # a hello: challenged, then dropped
                    tally.note(f"garbage to {addr} was answered {said[:2]}")
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def member(addr: str, token: str, hidden: int, epoch: int, rng: random.Random, tally: Tally, faults,
                 burst: int) -> None:
    """Up to `burst` bad frames on one authenticated link (one is enough to be hung up on, mostly), then a
    frame of no known type, which must be."""
    since = time.monotonic()
    try:
        async with asyncio.timeout(HANG_UP_S):
            reader, writer = await authenticate(addr, token)
    except (OSError, ConnectionError, KeyError, TypeError, wire.WireError, TimeoutError):
        return  # a member restarting or stopped, or the port gone
    tally.connections += 1
    try:
        for _ in range(burst):
            writer.write(encode(bad_fwd(rng, hidden, epoch)))
            tally.frames += 1
            tally.frames_authenticated += 1
        writer.write(raw_frame({"t": "who-knows"}))
        tally.frames += 1
        tally.frames_authenticated += 1
        await writer.drain()
        _, closed = await read_until_closed(reader, HANG_UP_S)
        if not closed:
            hung(tally, faults, since, f"an authenticated member's bad frames to {addr}")
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def run(ring: Ring, hidden: int, deadline: float, rate: float, tally: Tally, faults, seed: int = 1) -> None:
    """About `rate` bad frames a second, half from strangers and half from a member holding the token, spread
    over the host's ring port and every ready member's; a few connections at a time."""
    rng = random.Random(seed)
    ring_addr = f"127.0.0.1:{ring.ring_port}"
    members, epoch, refreshed = [], 0, 0.0
    async with asyncio.TaskGroup() as tg:
        pending: set[asyncio.Task] = set()
        while time.monotonic() < deadline:
            if time.monotonic() - refreshed > 2:
                try:
                    h = await asyncio.to_thread(ring.health)
                except Exception:  # noqa: BLE001 - the watch notes it; try again shortly
                    h = {"epoch": epoch}
                epoch, refreshed = h["epoch"], time.monotonic()
                members = [m["address"] for m in h.get("members", [])[1:] if m["state"] == "ready" and m["address"]]
            pending = {t for t in pending if not t.done()}
            if len(pending) < 8:
                addr = rng.choice([ring_addr, *members])
                if rng.random() < 0.5:
                    pending.add(tg.create_task(stranger(addr, rng, tally, faults)))
                else:
                    pending.add(tg.create_task(member(addr, ring.token, hidden, epoch, rng, tally, faults,
                                                      burst=rng.choice([1, 1, 4]))))
            await asyncio.sleep(1 / rate)
