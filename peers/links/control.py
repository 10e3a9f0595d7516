"""The control protocol between the host and each member, as one small state machine both sides run.

    member                        host
      offer         ---->                   once, right after the handshake
                    <----   assign          a span for plan `epoch` (again at every re-plan)
      progress      ---->                   while it downloads its weights
      ready | fail  ---->                   for that epoch
                    <----   ping            every heartbeat
      pong          ---->                   its round trip is the member's RTT
                    <----   drop            a conversation ended: free its caches
                    <----   bye             the ring closes
      bye           ---->                   the member leaves (Ctrl+C): a departure, not a failure
      link          ---->                   a data link of plan `epoch` broke at this member ({epoch, hop,
                                            error}): the host fails that plan's passes and re-wires at once
      error         <--->   error           the sender closes the link, and says why

The data links (fwd and fail frames, peers/member/peer.py) are not part of it.
"""
from __future__ import annotations

from peers.links.channel import Channel, ChannelClosed
from peers.wire.codec import WireError

# what one side may receive from the other, by the state of the link
RECEIVES = {
    ("host", "joining"): {"offer"},
    ("host", "joined"): {"progress", "ready", "fail", "pong", "bye", "link", "quiet"},
    ("member", "joined"): {"assign", "ping", "drop", "bye", "warm"},
}
AFTER = {"offer": "joined", "bye": "closed"}  # the messages that move the link on; the others leave it as it is


class ControlLink:
    """One side's end of a control link: what it receives is checked against the state, then moves it on."""

    def __init__(self, ch: Channel, side: str):
        self.ch, self.side = ch, side
        self.state = "joining" if side == "host" else "joined"  # a member's offer is sent before it follows

    def take(self, msg: dict) -> dict:
        """Check one received message and move the state on: "error" closes the link (ChannelClosed), a message
        the other side may not send now breaks the protocol (WireError)."""
        t = msg["t"]
        if t == "error":
            raise ChannelClosed(f"{self.ch.name}: {msg.get('error')}")
        if t not in RECEIVES[self.side, self.state]:
            raise WireError(f"unexpected {t!r} on a control link ({self.state})")
        self.state = AFTER.get(t, self.state)
        return msg

    async def recv(self, timeout: float | None = None) -> dict:
        return self.take(await self.ch.recv(timeout))

    async def follow(self, handlers: dict) -> None:
        """Hand each message to the handler for its type until the link closes: returns on "bye", raises
        ChannelClosed when it breaks or the other side sends "error", WireError when it breaks the protocol."""
        while self.state != "closed":
            msg = await self.recv()
            if (handler := handlers.get(msg["t"])) is not None:
                await handler(msg)
