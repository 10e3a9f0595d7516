"""The control protocol's state machine (peers/control.py) over two real Channels joined in memory."""
import pytest
import trio
import trio.testing

from peers.channel import Channel, ChannelClosed
from peers.control import ControlLink
from peers.wire import WireError


def pair() -> tuple[Channel, Channel]:
    """The member's end and the host's, each named after the other end (as the real ones are)."""
    a, b = trio.testing.memory_stream_pair()
    return Channel(a, "host"), Channel(b, "member 1")


async def host_follows(sent: list[dict]) -> list[str]:
    """What the host's handlers saw of the member's messages `sent`."""
    member, host = pair()
    seen: list[str] = []

    async def note(msg):
        seen.append(msg["t"])

    for msg in sent:
        await member.send(msg)
    link = ControlLink(host, "host")
    await link.recv()
    with trio.move_on_after(1):
        await link.follow({"ready": note, "fail": note, "pong": note})
    return seen


def test_the_offer_comes_first_then_answers():
    assert trio.run(host_follows, [{"t": "offer"}, {"t": "pong"}, {"t": "ready"}, {"t": "fail"}]) == [
        "pong", "ready", "fail"]
    with pytest.raises(WireError, match="'pong'"):
        trio.run(host_follows, [{"t": "pong"}])  # before its offer


def test_each_side_refuses_what_only_it_sends():
    with pytest.raises(WireError, match="'assign'"):
        trio.run(host_follows, [{"t": "offer"}, {"t": "assign"}])  # a member never assigns
    with pytest.raises(WireError, match="'offer'"):
        trio.run(host_follows, [{"t": "offer"}, {"t": "offer"}])  # nor offers twice

    async def member_gets(msg: dict) -> None:
        member, host = pair()
        await host.send(msg)
        await ControlLink(member, "member").recv()

    with pytest.raises(WireError, match="'ready'"):
        trio.run(member_gets, {"t": "ready"})


def test_bye_ends_the_link_and_error_closes_it():
    async def member_follows(msgs: list[dict]) -> tuple[str, list[str]]:
        member, host = pair()
        seen: list[str] = []

        async def note(msg):
            seen.append(msg["t"])

        for msg in msgs:
            await host.send(msg)
        link = ControlLink(member, "member")
        await link.follow({"ping": note, "assign": note, "drop": note})
        return link.state, seen

    assert trio.run(member_follows, [{"t": "ping"}, {"t": "assign"}, {"t": "drop"}, {"t": "bye"}, {"t": "ping"}]) == (
        "closed", ["ping", "assign", "drop"])
    with pytest.raises(ChannelClosed, match="host: shutting down"):
        trio.run(member_follows, [{"t": "ping"}, {"t": "error", "error": "shutting down"}])
