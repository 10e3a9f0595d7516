"""Hostile input against a live host and peer: garbage, truncation, huge lengths, wrong fields and shapes,
HTTP, silence. Nothing crashes or hangs, memory stays bounded, and the ring still answers exactly."""
import os
import struct

import cbor2
import pytest
import torch
import trio

from helpers import greedy_reply, reference_ids, running_ring
from peers.links import auth
from peers.wire import tensors
from peers.links.auth import client_handshake
from peers.links.channel import Channel, ChannelClosed, parse_addr
from peers.compute.memory import rss_bytes

PROMPT = "hello world, the quick brown fox"


async def send_raw(addr: str, data: bytes) -> bytes:
    """Send bytes and read until the other side hangs up: what it said first. A side that neither hangs up nor
    answers within its handshake limit (10 s in a peer process) fails the test."""
    stream = await trio.open_tcp_stream(*parse_addr(addr))
    got = b""
    with trio.fail_after(30):
        try:
            await stream.send_all(data)
            while chunk := await stream.receive_some(65536):
                got += chunk
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # it hung up on us mid-send
    await stream.aclose()
    return got


def frames(data: bytes) -> list:
    """The whole frames in what a side sent (the same length-prefixed CBOR as frame() below)."""
    out = []
    while len(data) >= 4 and len(data) >= 4 + (n := struct.unpack(">I", data[:4])[0]):
        out.append(cbor2.loads(data[4:4 + n]))
        data = data[4 + n:]
    assert data == b"", f"a partial frame: {data[:40]!r}"
    return out


def frame(obj) -> bytes:
    body = cbor2.dumps(obj)
    return struct.pack(">I", len(body)) + body


GARBAGE = [
    os.urandom(4096),
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"\xff\xff\xff\xf0" + b"x" * 100,  # a 4 GB frame announced
    frame({"t": "hello"})[:-3],  # truncated, then the sender goes quiet
    frame({"t": "hello", "role": "join", "nonce": b"short"}),
    frame([1, 2, 3]),
    frame({"t": "auth", "proof": b"\0" * 32}),
]


def hidden(shape, dtype=torch.float32) -> dict:
    """A frame's hidden states: the header in the body, the bytes raw after it."""
    header, raw = tensors.host_bytes(torch.zeros(shape, dtype=dtype))
    return {"x": header, "raw": raw}


def bad_frames(hidden_size: int, epoch: int) -> list[dict]:
    ok = dict(t="fwd", epoch=epoch, sid="evil", seq=0, committed=0, n_logits=1, trace=[])
    one = hidden((1, 1, hidden_size))
    seg = dict(sid="evil", committed=2, n=1, n_logits=1)
    return [
        ok | hidden((1, 3, hidden_size + 1)),  # wrong hidden size
        ok | hidden((3, hidden_size)),  # wrong rank
        ok | {"x": {"dtype": "float32", "shape": [1, 2, hidden_size]}, "raw": b"\0" * 7},  # lying shape
        ok | {"x": {"dtype": "float32", "shape": [1, 1, hidden_size]}, "raw": 1 << 27},  # a count past the limit
        ok | {"x": {"dtype": "float32", "shape": [1, 1, hidden_size]}, "raw": "many"},  # a count that is none
        ok | {"x": {"dtype": "float32", "shape": [1, 1, hidden_size], "data": b"\0" * 4 * hidden_size}},  # not raw
        ok | hidden((1, 1, hidden_size), torch.int64),  # wrong dtype
        ok | {"committed": -5} | one,
        ok | {"sid": 7} | one,
        ok | {"trace": "nope"} | one,
        ok | one | {"batch": [seg | {"keep": "all", "parents": [-1]}]},
        ok | one | {"batch": [seg | {"keep": [3, 2], "parents": [-1, 0, 1]}]},  # descending
        ok | one | {"batch": [seg | {"keep": [1], "parents": [-1, 0]}]},  # below committed
        ok | one | {"batch": [seg | {"keep": [True], "parents": [-1, 0]}]},
        ok | one | {"batch": [seg | {"keep": list(range(2, 600)), "parents": list(range(-1, 598))}]},  # too many
        ok | one | {"batch": [seg | {"keep": [2], "parents": [-1]}]},  # parents not over kept and new rows
        ok | one | {"batch": [seg | {"keep": [2]}]},  # no parents
        ok | one | {"batch": [seg | {"skip": 1}]},
        ok | one | {"batch": [seg | {"skip": True}]},  # skipped, yet its row is in the frame
        ok | hidden((1, 0, hidden_size)),  # no rows, and no batch whose segments were skipped
        {"t": "cancel", "epoch": epoch, "segments": "all"},
        {"t": "cancel", "epoch": epoch, "segments": [["evil"]]},
        {"t": "cancel", "epoch": epoch, "segments": [[7, 0]]},
        {"t": "cancel", "segments": []},  # no epoch
        {"t": "cancel", "epoch": epoch, "segments": [], "raw": b"\0" * 8},
        {"t": "fail", "raw": b"\0" * 8},  # raw bytes on a message that carries none
        {"t": "assign", "epoch": 3},  # a control message on a data link
        {"t": "who-knows"},
    ]


def test_live_host_and_peer_survive_hostile_input(tiny_llama, monkeypatch):
    monkeypatch.setattr(auth, "HANDSHAKE_S", 3.0)  # the host is in this process: a shorter handshake limit

    async def main():
        async with running_ring(tiny_llama, 1) as (host, lp):
            peer_addr, peer_pid = host.ring[0].data_addr, lp.procs[0].pid
            rss0 = rss_bytes(peer_pid)
            # a silent connection is dropped after the handshake limit, and holds nothing meanwhile
            silent = await trio.open_tcp_stream(*parse_addr(host.address))
            for target in (host.address, peer_addr):
                for data in GARBAGE:  # each hung up on, after at most an error frame saying why
                    said = frames(await send_raw(target, data))
                    assert all(f["t"] == "error" and f["error"] for f in said) and len(said) <= 1, (target, data, said)
            # members who hold the token but send nonsense get an error and a closed link; naming the current
            # plan, they are still not the ring's link (no keepalive came first): no re-wiring for them
            epoch = host.epoch
            for msg in bad_frames(host.config.hidden_size, host.epoch):
                ch = Channel(await trio.open_tcp_stream(*parse_addr(peer_addr)), "evil")
                await client_handshake(ch, host.token, "data", epoch=epoch)
                await ch.send(msg)
                reply = await ch.recv(timeout=10)
                assert reply["t"] == "error" and reply["error"], msg
                with pytest.raises(ChannelClosed):
                    await ch.recv(timeout=5)
            with trio.fail_after(10):
                assert await silent.receive_some(10) == b""  # the host hung up on it
            await trio.sleep(1)  # (a link report would have re-wired the ring by now)
            assert lp.procs[0].poll() is None and host.ring[0].state == "ready" and host.epoch == epoch
            assert rss_bytes(peer_pid) - rss0 < 64 * 2**20
            return await greedy_reply(host, PROMPT, 16)

    assert trio.run(main) == reference_ids(tiny_llama, PROMPT, 16)


def test_return_link_refuses_keys_that_cannot_be_keys(tiny_llama):
    """A member's frame on the host's return link whose sid or seq is a list (unhashable) gets a one-line error,
    not an internal TypeError from looking it up among the passes waiting."""

    async def main():
        async with running_ring(tiny_llama, 0) as (host, _):
            said = []
            for msg in ({"t": "fwd", "epoch": host.epoch, "sid": ["a"], "seq": 0, "committed": 0, "n_logits": 1,
                         "trace": []} | hidden((1, 1, host.config.hidden_size)),
                        {"t": "fail", "sid": "x", "seq": [0], "error": "?"}):
                ch = Channel(await trio.open_tcp_stream(*parse_addr(host.address)), "evil")
                await client_handshake(ch, host.token, "data")
                await ch.send(msg)
                await ch.send({"t": "who-knows"})  # ignored or not, the link ends here
                said.append((await ch.recv(timeout=10))["error"])
                await ch.aclose()
            return said

    said = trio.run(main)
    assert not any("internal error" in e for e in said), said
