"""The control protocol's state machine (peers/links/control.py) over two real Channels joined in memory."""
import pytest
import trio
import trio.testing

from peers.links.channel import Channel, ChannelClosed
from peers.links.control import ControlLink
from peers.wire.codec import WireError


def follows(side: str, sent: list[dict], handled: tuple[str, ...]) -> tuple[str, list[str]]:
    """`side` follows its link while the other side sends `sent` and hangs up: the state it ends in and what its
    handlers saw (a host first takes the offer). Following ends at the hang-up at the latest: a link that is
    still followed after it fails the test."""
    async def main():
        a, b = trio.testing.memory_stream_pair()  # each end named after the other, as the real ones are
        theirs, mine = (Channel(a, "host"), Channel(b, "member 1")) if side == "host" else (
            Channel(b, "member 1"), Channel(a, "host"))
        for msg in sent:
            await theirs.send(msg)
        await theirs.aclose()
        link, seen = ControlLink(mine, side), []

        async def note(msg):
            seen.append(msg["t"])

        if side == "host":
            await link.recv()
        with trio.fail_after(5):
            try:
                await link.follow(dict.fromkeys(handled, note))
            except ChannelClosed as e:
                if not str(e).endswith(": connection closed"):  # not our hang-up: an "error" it was sent
                    raise
        return link.state, seen

    return trio.run(main)


HOST_HANDLES = ("ready", "fail", "pong")
MEMBER_HANDLES = ("ping", "assign", "drop")


def test_the_offer_comes_first_then_answers():
    sent = [{"t": "offer"}, {"t": "pong"}, {"t": "ready"}, {"t": "fail"}]
    assert follows("host", sent, HOST_HANDLES) == ("joined", ["pong", "ready", "fail"])
    with pytest.raises(WireError, match="'pong'"):
        follows("host", [{"t": "pong"}], HOST_HANDLES)  # before its offer


def test_each_side_refuses_what_only_it_sends():
    with pytest.raises(WireError, match="'assign'"):
        follows("host", [{"t": "offer"}, {"t": "assign"}], HOST_HANDLES)  # a member never assigns
    with pytest.raises(WireError, match="'offer'"):
        follows("host", [{"t": "offer"}, {"t": "offer"}], HOST_HANDLES)  # nor offers twice
    with pytest.raises(WireError, match="'ready'"):
        follows("member", [{"t": "ready"}], MEMBER_HANDLES)  # a host is never ready


def test_bye_ends_the_link_and_error_closes_it():
    sent = [{"t": "ping"}, {"t": "assign"}, {"t": "drop"}, {"t": "bye"}, {"t": "ping"}]
    assert follows("member", sent, MEMBER_HANDLES) == ("closed", ["ping", "assign", "drop"])
    with pytest.raises(ChannelClosed, match="host: shutting down"):
        follows("member", [{"t": "ping"}, {"t": "error", "error": "shutting down"}], MEMBER_HANDLES)
