"""The host's return link: the last member's results come back here, each to the pass waiting for it.

A pass is sent to the first member with a sequence number and waits for the reply of that number; the reply's
hidden states land straight in the place the pass keeps for them, where they fit it. A member declared lost fails
every pass waiting on the ring at once.
"""
from __future__ import annotations

import itertools

import torch
import trio

from peers.compute import device
from peers.wire import schema as validate, codec as wire
from peers.links.channel import Channel, ChannelClosed
from peers.links.liveness import watched
from peers.base.errors import ConversationLost, MemberLeft, RingError
from peers.base.stalls import STALLS


class ReturnLink:
    def __init__(self, host):
        self.host = host  # its ring, first hop, roster, config and device: what the current plan says
        # (sid, seq) -> where its reply goes, and the tensor its hidden states land in (None: one of their own)
        self.waiting: dict[tuple[str, int], tuple[trio.MemorySendChannel, torch.Tensor | None]] = {}
        self.seq = itertools.count()
        self.sent = self.answered = 0  # frames sent round (each a pass of one or more conversations), answered

    async def serve(self, ch: Channel) -> None:
        """The last hop's results come back here; hand each to the pass waiting for it."""
        watched(ch)  # the last member keeps it alive: silence means a dead link, FIN or not
        while True:
            msg = await ch.recv(into=self._landing)
            if msg["t"] in ("cancel", "ka"):  # its own cancel come round (every member has it), a keepalive
                continue
            if msg["t"] not in ("fwd", "fail"):
                raise wire.WireError(f"unexpected {msg['t']!r} on the return link")
            waiter = self._waiter(msg)
            if waiter is not None:
                waiter[0].send_nowait(msg)

    def _waiter(self, msg: dict):
        """The pass waiting for a returned frame, if any: its sid and seq are whatever a member sent (a list, say)."""
        sid, seq = msg.get("sid"), msg.get("seq")
        return self.waiting.get((sid, seq)) if isinstance(sid, str) and isinstance(seq, int) else None

    def _landing(self, msg: dict, n: int) -> memoryview:
        """Where the last hop's hidden states land, once checked: in the place their pass keeps for them, if they
        fit it; else a buffer of their own (pinned if they go on to a GPU)."""
        place = (self._waiter(msg) or (None, None))[1]
        return validate.landing(msg, n, self.host.config.hidden_size, device.pinned(self.host.device), place)

    async def round_trip(self, frame: dict, n_positions: int, sent: list, place: torch.Tensor | None = None) -> dict:
        """Send a pass to the first member and wait for the last one's reply (RingError if the ring fails it); the
        reply's hidden states land in `place` if they fit it."""
        seq = frame["seq"] = frame["seq"] if "seq" in frame else next(self.seq)
        send, recv = trio.open_memory_channel(1)
        self.waiting[(frame["sid"], seq)] = (send, place)
        try:
            await self._send(frame)
            self.sent += 1
            for event in sent:
                if event is not None:
                    event.set()  # the host's part is done: the round is on the wire
            reply = await self._await_reply(recv, pass_timeout(n_positions), frame["epoch"], seq)
        except (ChannelClosed, trio.TooSlowError) as e:
            raise RingError(f"the ring did not answer: {e}") from None
        finally:
            del self.waiting[(frame["sid"], seq)]
        if reply["t"] == "fwd":
            self.answered += 1
        if reply["t"] == "fail":
            if reply.get("oom"):
                self.host.roster.out_of_memory(reply.get("member"), str(reply.get("error")))
            raise (ConversationLost if reply.get("lost") else RingError)(str(reply.get("error")))
        return reply

    async def _send(self, frame: dict) -> None:
        """The frame into the first hop. A send can wait long where the first member stopped reading (stopped,
        cut off: its buffers full); a member lost or a link of the plan broken meanwhile fails it at once, and the
        first hop, maybe with half a frame on it, is closed (the recovery wires a new one)."""
        first, fault, error = self.host.first_hop, None, None
        async with trio.open_nursery() as nursery:
            async def watch():
                nonlocal fault
                while (fault := self._fault(frame["epoch"])) is None:
                    await trio.sleep(0.1)
                nursery.cancel_scope.cancel()
            nursery.start_soon(watch)
            try:
                await first.send(frame)
            except ChannelClosed as e:  # (raised below, outside the nursery: as itself, not in a group)
                error = e
            nursery.cancel_scope.cancel()
        if fault is not None:
            await trio.aclose_forcefully(first.stream)
            raise fault
        if error is not None:
            raise error

    def _fault(self, epoch: int) -> RingError | None:
        """Why passes of plan `epoch` cannot be answered: a link of it broke, or a ring member left or was lost."""
        if broken := self.host.planner.broken.get(epoch):
            return RingError(broken)
        lost = [m for m in self.host.ring if m.state == "lost"]
        if lost and lost[0].left:
            return MemberLeft(f"member {lost[0].id} ({lost[0].name}) left")
        if lost:
            return RingError(f"member {lost[0].id} ({lost[0].name}) was lost: {lost[0].error}")
        return None

    async def _await_reply(self, recv: trio.MemoryReceiveChannel, timeout: float, epoch: int, seq: int) -> dict:
        """The pass's result, or RingError as soon as a ring member is declared lost or a link of its plan broke.
        The timeout is only a backstop for a frame lost without a word, and it runs from the last sign of progress:
        a pong of a member computing a frame (a long prefill on a slow CPU, or the frames queued before this one),
        or this process's own stall (a host paused or blocked did not read the reply meanwhile)."""
        deadline = trio.current_time() + timeout
        while trio.current_time() < deadline or STALLS.within(timeout):
            with trio.move_on_after(0.1):
                return await recv.receive()
            if STALLS.within(timeout) or any(m.computing is not None for m in self.host.ring):
                deadline = max(deadline, trio.current_time() + timeout)
            if (fault := self._fault(epoch)) is not None:
                raise fault
        raise trio.TooSlowError


def pass_timeout(n_tokens: int) -> float:
    """Seconds without progress before a pass counts as lost: shorter than a user waits without noticing much,
    far longer than any hop of a live ring takes (members report the frame they compute at every pong)."""
    return PASS_TIMEOUT_S + n_tokens * 0.03  # (a position of a 7B model in bfloat16 is 7 KB: 2 Mbit/s)


PASS_TIMEOUT_S = 8.0
