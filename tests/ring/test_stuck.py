"""The waits that could hold a ring up for a pass timeout (the soak's 93-s stall, docs/reliability.md), each
reproduced: a frame that comes before a member's next hop is wired, one whose member's load outlasts a fixed wait,
and a pass stuck in a send into a stopped member's full buffers. Each time the ring answers within seconds."""
import signal
import socket
import time

import trio

from helpers import new_chat, reference_ids, running_ring
from peers.base.options import PeerOptions
from peers.links import dial as links
from peers.links.auth import client_handshake
from peers.links.channel import Channel, ChannelClosed
from peers.links.liveness import keep_alive
from peers.member.peer import Peer
from peers.speculation.adaptive import KPolicy
from peers.speculation.drafting import Drafter
from peers.speculation.sampling import SamplingParams
from sfchat.local import local_name
from tiny import make_model

LOAD_S = 12.0  # past the 10 s a frame that came before any plan waits for one to begin


async def early_frame(host, nursery, name: str):
    """A member in this process, joined and not yet planned, and a frame on its previous hop's link (kept alive as
    a ring link is) before it has a next hop: the link, and where the host's return link hands the frame."""
    peer = Peer(PeerOptions(host.address, host.token, listen="127.0.0.1:0", device="cpu", name=name))
    await nursery.start(peer.run)
    await host.wait_members(1)
    prev = Channel(await links.dial(host.members[0].data_addr), "test prev hop")
    await client_handshake(prev, host.token, "data")
    await nursery.start(keep_alive, prev)  # (its silence would be a dead link)
    got, replies = trio.open_memory_channel(1)
    host.returns.waiting[("early-sid", 7)] = (got, None)
    await prev.send({"t": "fail", "epoch": 0, "sid": "early-sid", "seq": 7, "error": "upstream"})
    return prev, replies


async def still_open(prev: Channel, seconds: float) -> None:
    with trio.move_on_after(seconds):
        try:
            await prev.recv()
        except ChannelClosed as e:  # before: "no next hop yet", the link closed
            raise AssertionError(f"the member closed the previous hop's link: {e}") from None


def test_a_frame_before_the_next_hop_is_wired_waits_for_it(tiny_llama):
    """A frame that reaches a member before its next hop is wired (its first plan on the way) waits for the hop
    rather than close the link it came on: closing it would lose every later frame of the previous hop's, and the
    host would learn of it only when a pass timed out."""
    async def main():
        async with running_ring(tiny_llama, 0, plan=False) as (host, _):
            async with trio.open_nursery() as nursery:
                prev, replies = await early_frame(host, nursery, "early")
                await still_open(prev, 0.5)
                await host.replan()  # wires the member's next hop: the host's return link
                with trio.fail_after(10):
                    msg = await replies.receive()
                assert msg["t"] == "fail" and msg["error"] == "upstream"
                await prev.aclose()
                nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_frame_waits_out_a_fresh_members_long_load(tiny_llama, monkeypatch):
    """The frame came before the member's first plan, and its load took 12 s: the frame waits for the assign
    however long its load, not a fixed 10 s after which its link was closed (and every frame behind it lost)."""
    load = Peer._load

    def slow_load(self, *args):
        time.sleep(LOAD_S)
        return load(self, *args)

    monkeypatch.setattr(Peer, "_load", slow_load)

    async def main():
        async with running_ring(tiny_llama, 0, plan=False) as (host, _):
            async with trio.open_nursery() as nursery:
                prev, replies = await early_frame(host, nursery, "slow")
                await host.replan()  # the member's load: 12 s; its next hop (the host) wired after it
                try:
                    with trio.fail_after(5):
                        msg = await replies.receive()
                except trio.TooSlowError:
                    raise AssertionError("the frame that came during the load was lost") from None
                assert msg["t"] == "fail" and msg["error"] == "upstream"
                await still_open(prev, 0.2)
                await prev.aclose()
                nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_pass_stuck_in_a_send_to_a_stopped_member_fails_when_it_is_lost(tmp_path):
    """The first member is stopped; the host's send of a long prompt's hidden states (4 MB) fills its buffers
    (the host's send buffer made small) and waits. The member is lost by its silence: the send fails then, not
    at its own deadline (20 s and more), and the ring re-plans without it."""
    model = make_model(tmp_path / "wide", "llama", layers=3, hidden=1024, intermediate_size=128,
                       num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096)
    prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 64)
    n = 4

    async def main():
        async with running_ring(model, 2, placement="memory") as (host, lp):
            host.auto_replan = True
            chat = new_chat(host)
            assert len(chat.tokenizer(prompt)["input_ids"]) > 1500
            first = host.ring[0]
            host.first_hop.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            names = [local_name(i) for i in range(len(lp.procs))]
            victim = lp.procs[names.index(first.name)]
            victim.send_signal(signal.SIGSTOP)
            stopped, back = time.monotonic(), None

            def on_round(ev):
                nonlocal back
                if ev["event"] == "round" and back is None:
                    back = time.monotonic() - stopped
            try:
                _, r = await chat.reply(prompt, drafter=Drafter(), params=SamplingParams(), policy=KPolicy(),
                                        max_new_tokens=n, on_round=on_round)
            finally:
                victim.send_signal(signal.SIGCONT)
            return r.token_ids, back, first.state

    ids, back, state = trio.run(main)
    assert state == "lost"
    assert back is not None and back < 5, f"the first pass came back {back:.1f} s after the member was stopped"
    assert ids == reference_ids(model, prompt, n)
