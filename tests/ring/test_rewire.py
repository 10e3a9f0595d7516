"""A frame that reaches a member before its next hop is wired (a re-plan under way, or its first) waits for the hop
rather than close the link it came on: closing it would lose every later frame of the previous hop's, and the host
would learn of it only when a pass timed out."""
import trio

from helpers import running_ring
from peers.links import dial as links
from peers.links.auth import client_handshake
from peers.links.channel import Channel, ChannelClosed
from peers.base.options import PeerOptions
from peers.member.peer import Peer


def test_a_frame_before_the_next_hop_is_wired_waits_for_it(tiny_llama):
    async def main():
        async with running_ring(tiny_llama, 0, plan=False) as (host, _):
            async with trio.open_nursery() as nursery:
                peer = Peer(PeerOptions(host.address, host.token, listen="127.0.0.1:0", device="cpu", name="early"))
                await nursery.start(peer.run)
                await host.wait_members(1)
                # the previous hop's link, opened before the member has a plan (so no next hop)
                prev = Channel(await links.dial(host.members[0].data_addr), "test prev hop")
                await client_handshake(prev, host.token, "data")
                got, replies = trio.open_memory_channel(1)
                host.returns.waiting[("early-sid", 7)] = (got, None)  # where the host's return link hands it
                await prev.send({"t": "fail", "epoch": 0, "sid": "early-sid", "seq": 7, "error": "upstream"})
                with trio.move_on_after(0.5):
                    try:
                        await prev.recv()
                    except ChannelClosed as e:  # before: "no next hop yet", the link closed
                        raise AssertionError(f"the member closed the previous hop's link: {e}") from None
                await host.replan()  # wires the member's next hop: the host's return link
                with trio.fail_after(10):
                    msg = await replies.receive()
                assert msg["t"] == "fail" and msg["error"] == "upstream"
                await prev.aclose()
                nursery.cancel_scope.cancel()

    trio.run(main)
