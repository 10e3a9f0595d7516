"""A channel over a real loopback socket, and the token handshake on it (peers/links/channel.py, auth.py)."""
import pytest
import trio

from peers.links.auth import AuthError, client_handshake, server_handshake
from peers.links.channel import SMALL, Channel, ChannelClosed, parse_addr


async def pair():
    """Two channels joined by a TCP connection on 127.0.0.1."""
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", port)
    server = await listener.accept()
    await listener.aclose()
    return Channel(client, "client"), Channel(server, "server")


def test_frames_small_and_large_arrive_whole_and_in_order():
    big = bytes(range(256)) * ((3 * SMALL) // 256)  # raw bytes past SMALL go out in a send of their own

    async def main():
        a, b = await pair()
        got = []

        async def receive():
            got.extend([await b.recv(timeout=5), await b.recv(timeout=5)])

        with trio.fail_after(10):
            async with trio.open_nursery() as n:
                n.start_soon(receive)  # (a frame past the socket's buffers waits for its reader)
                await a.send({"t": "one", "raw": b"xy"})
                await a.send({"t": "two", "raw": big})
        assert {m["t"]: bytes(m["raw"]) for m in got} == {"one": b"xy", "two": big}
        await a.aclose()
        with pytest.raises(ChannelClosed, match="connection closed"):
            await b.recv(timeout=5)

    trio.run(main)


def test_a_silent_link_times_out_as_closed():
    async def main():
        a, b = await pair()
        with pytest.raises(ChannelClosed, match="no message within"):
            await b.recv(timeout=0.2)
        await a.aclose()

    trio.run(main)


def test_parse_addr():
    assert parse_addr("10.0.0.2:7000") == ("10.0.0.2", 7000)
    assert parse_addr(":7000") == ("127.0.0.1", 7000)
    assert parse_addr("[::1]:9") == ("::1", 9)
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_addr("10.0.0.2")


def handshake(client_token: str, server_token: str):
    async def main():
        a, b = await pair()
        out = {}

        async def side(name, fn):
            try:
                out[name] = await fn()
            except AuthError as e:
                out[name] = e

        async with trio.open_nursery() as n:
            n.start_soon(side, "client", lambda: client_handshake(a, client_token, "member", name="m1"))
            n.start_soon(side, "server", lambda: server_handshake(b, server_token, {"ok": 1}))
        return out

    return trio.run(main)


def test_the_same_token_is_welcomed():
    out = handshake("secret", "secret")
    assert out["client"]["t"] == "welcome" and out["client"]["ok"] == 1
    assert out["server"]["role"] == "member" and out["server"]["name"] == "m1"


def test_a_wrong_token_is_refused_on_both_sides():
    out = handshake("guess", "secret")
    # the client finds out first (the server's proof is wrong) and hangs up
    assert isinstance(out["server"], AuthError) and "another token" in str(out["server"])
    assert isinstance(out["client"], AuthError) and "does not hold this token" in str(out["client"])
