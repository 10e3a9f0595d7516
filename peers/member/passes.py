"""A member's data plane: fwd frames in from the previous hop, this span's layers over them, computed frames out to
the next hop. Each conversation's cache here (a row of the shard's KV arena) lives in `sessions`; a frame names the
positions every stage keeps (`committed`), the rollback rule. The control plane (peers/member/peer.py) loads the span and
points `next` at the next hop.

The previous hop's frames are read ahead of the one computing, into a queue: a 'cancel' from the host (segments
of frames it no longer needs) goes on to the next hop as soon as it arrives, and a queued frame's cancelled
segments are skipped (peers/compute/shard.py skip: laid out, not computed, no rows) when their turn comes.
"""
from __future__ import annotations

import logging
import math
import time
from collections import deque
from contextlib import asynccontextmanager
from functools import partial

import torch
import trio

from peers.base.limits import SESSION_IDLE_S
from peers.compute import device, kv
from peers.wire import tensors, schema as validate, codec as wire
from peers.links.auth import AuthError, server_handshake
from peers.links.channel import Channel, ChannelClosed, idle_s
from peers.links.liveness import say_quiet, watched
from peers.compute.memory import injected_failure, injected_slowness, is_oom, oom_line
from peers.compute.runtime import RUNTIME, Pinned
from peers.compute.shard import Shard

log = logging.getLogger("sfchat.peer")
READ_AHEAD = 64  # frames queued behind the one computing
CANCELS_KEPT = 1024
REWIRE_WAIT_S = 10.0  # how long a frame that came before any plan waits for one to begin


class DataPlane:
    def __init__(self, peer):
        self.peer = peer  # its shard, plan (epoch), name and state
        self.sessions: dict[str, object] = {}
        # conversations the host ended: a frame of theirs still on its way (the drop on the control link overtook
        # it) must not bring their caches back
        self.dropped: deque[str] = deque(maxlen=256)
        # (sid, seq): segments the host cancelled, the last CANCELS_KEPT of them (a dict: looked up per segment)
        self.cancelled: dict[tuple[str, int], None] = {}
        self.unfinished = 0  # frames read and not yet computed
        self.computing: tuple[int, float] | None = None  # (seq, since when) of the frame its layers run over now
        self.next: Channel | None = None
        # set while `next` is wired; an assign clears it from its start (the load) to its new hop's dial
        self.wired = trio.Event()
        self.assigning = False
        self.compute = trio.CapacityLimiter(1)  # one forward at a time on this device
        # a GPU member's hop buffers, reused: a frame lands in one when none is waiting or computing (it is on the
        # device before the next lands there), and its result leaves from the other before the next pass runs
        self.inbound, self.outbound = Pinned(), Pinned()

    def drop(self, sid: str) -> None:
        self.sessions.pop(sid, None)
        self.dropped.append(sid)

    async def serve(self, stream: trio.SocketStream) -> None:
        try:
            stream = await self.peer.tls.accept(stream)
        except (OSError, trio.BrokenResourceError, trio.TooSlowError) as e:
            log.warning("TLS handshake on a data link failed: %s", e)
            return
        ch = Channel(stream, "prev hop", read_timeout=idle_s())
        epoch = None  # the plan the previous hop wired this link for (its hello says)
        try:
            hello = await server_handshake(ch, self.peer.token)
            epoch = hello.get("epoch") if isinstance(hello.get("epoch"), int) else None
            watched(ch)  # its writer keeps it alive: silence means a dead link, FIN or not
            ch.excused = self.peer.host_silent  # unless the host is silent everywhere: paused or busy, not cut off
            queued, frames = trio.open_memory_channel(READ_AHEAD)
            error = None
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_ahead, ch, queued)
                nursery.start_soon(say_quiet, ch, partial(self.peer.quiet, epoch, "prev hop"))
                try:
                    await self._take(frames)
                except Exception as e:  # (raised below, outside the nursery: as itself, not in a group)
                    error = e
                nursery.cancel_scope.cancel()
            if error is not None:
                raise error
        except AuthError as e:
            log.info("data link closed: %s", e)
        except ChannelClosed as e:
            log.info("data link closed: %s", e)
            await self._down(ch, epoch, str(e))  # (a re-wiring's old link: the host knows)
        except wire.WireError as e:
            log.warning("bad frame from the previous hop: %s", e)
            await ch.error(str(e))
            await self._down(ch, epoch, str(e))
        except Exception as e:  # one bad link must never take the peer down
            log.exception("data link failed")
            await ch.error(f"internal error: {type(e).__name__}")
            await self._down(ch, epoch, f"internal error: {type(e).__name__}")
        finally:
            await ch.aclose()

    async def _down(self, ch: Channel, epoch: int | None, why: str) -> None:
        """Tell the host its ring's link into this member ended. Only a link that carried a keepalive is the ring's
        (a ring member keeps its link alive from the start): another holder of the token, hung up on, is no news."""
        if ch.kept_alive:
            await self.peer.link_down(epoch, "prev hop", why)

    async def _read_ahead(self, ch: Channel, queued: trio.MemorySendChannel) -> None:
        """The link's frames into the queue as they come; a cancel goes on at once. What ends the link (a bad
        frame, a closed link) is queued in its place: the frames before it are still computed."""
        async with queued:
            try:
                while True:
                    msg = await ch.recv(into=self._landing)
                    if msg["t"] == "ka":
                        ch.kept_alive = True
                        continue
                    if msg["t"] == "cancel":
                        await self._cancel(msg)
                        continue
                    self.unfinished += 1
                    await queued.send(msg)
            except Exception as e:
                await queued.send(e)

    async def _take(self, frames: trio.MemoryReceiveChannel) -> None:
        """The queued frames in order: failures travel on to the host, passes are computed."""
        async for msg in frames:
            if isinstance(msg, Exception):
                raise msg
            try:
                if msg["t"] == "fail":  # an upstream failure travels on to the host
                    await self._send_next(msg)
                elif msg["t"] != "fwd":
                    raise wire.WireError(f"unexpected {msg['t']!r} on a data link")
                else:
                    await self._forward(msg)
            finally:
                self.unfinished -= 1

    async def _cancel(self, msg: dict) -> None:
        """Segments the host cancelled: remembered, and told to the next hop before anything queued here goes."""
        self.cancelled.update(dict.fromkeys(validate.cancel(msg)))
        while len(self.cancelled) > CANCELS_KEPT:  # the oldest go (a dict keeps its order)
            del self.cancelled[next(iter(self.cancelled))]
        try:
            await self._send_next(msg)
        except ChannelClosed as e:  # (a frame that finds the next hop gone says so)
            log.info("cancel not passed on: %s", e)

    async def _forward(self, msg: dict) -> None:
        """One pass: of one conversation, or of several ("batch", each with its own session and rollback). A
        conversation this member cannot continue (it lacks the positions the frame says are committed) is left
        out and named in "failed"; the others go on."""
        shard = self.peer.shard
        if shard is None:
            return await self._fail(msg, f"{self.peer.name} holds no layers yet")
        x = validate.forward_frame(msg, shard.hidden_size)  # schema first: a bad frame closes the link
        many = "batch" in msg  # (a frame without one is a batch of one, its own fields its segment's)
        segs = validate.segments(msg, x.shape[1]) if many else [
            {"sid": msg["sid"], "committed": msg["committed"], "n": x.shape[1],
             **({"parents": msg["parents"]} if "parents" in msg else {})}]
        if msg["epoch"] != self.peer.epoch:  # a frame of an older plan: the host will replay
            return await self._fail(msg, f"{self.peer.name} is not on plan {msg['epoch']} but {self.peer.epoch}")
        passes, skips, kept, failed = [], [], [], dict(msg.get("failed") or {})
        for seg, (a, b) in zip(segs, validate.bounds(segs)):
            sid = seg["sid"]
            if sid in self.dropped:  # ended: its caches stay gone
                continue
            s = self.sessions.get(sid) or self.sessions.setdefault(sid, shard.new_session())
            try:
                if seg["committed"] > s.length:  # it lost its caches here (a new plan, say): the host will replay
                    raise ValueError(f"frame says {seg['committed']} positions are committed but this peer holds "
                                     f"{s.length}")
                kv.check_keep(seg.get("keep"), seg["committed"], s.length)
            except ValueError as e:
                self.sessions.pop(sid, None)
                failed[sid] = f"{self.peer.name}: {e}"
                continue
            if many and (seg.get("skip") or (sid, msg["seq"]) in self.cancelled):
                seg["skip"] = True  # every later member lays it out too, computing nothing
                skips.append((s, seg["committed"], seg.get("keep"), seg["n"]))
            else:
                passes.append((s, seg["committed"], x[:, a:b], seg.get("parents"), seg.get("keep")))
            kept.append(seg)
        if not kept:  # (its conversations ended, too: the pass that sent it still waits for the reply)
            return await self._fail(msg, "; ".join(failed.values()) or "its conversations ended", warn=bool(failed),
                                    lost=bool(failed))
        try:
            self.computing = (msg["seq"], time.monotonic())  # what its pongs say meanwhile: a long pass is progress
            (msg["x"], msg["raw"]), ms = await trio.to_thread.run_sync(RUNTIME.call, shard.device, self._compute,
                                                                       shard, passes, skips, limiter=self.compute)
        except ValueError as e:
            for seg in kept:
                self.sessions.pop(seg["sid"], None)
            return await self._fail(msg, f"{self.peer.name}: {e}")
        except RuntimeError as e:  # out of memory (torch.OutOfMemoryError is one): named, and the host re-plans
            if not is_oom(e):
                raise
            for seg in kept:
                self.sessions.pop(seg["sid"], None)
            who = f"member {self.peer.member_id} ({self.peer.name})"
            return await self._fail(msg, oom_line(who, self.peer.device, f"in a pass of {x.shape[1]} positions"),
                                    oom=True)
        finally:
            self.computing = None
        if many:
            msg["batch"], msg["failed"] = kept, failed
        msg["trace"].append([self.peer.name, round(ms, 3)])
        await self._send_next(msg)
        self._gc_sessions()
        self.peer._changed(frames=self.peer.st.frames + 1, sessions=len(self.sessions),
                           compute_ms=(self.peer.st.compute_ms + [ms])[-120:])

    def _landing(self, msg: dict, n: int) -> memoryview:
        """Where a frame's hidden states land: checked first, then the reused pinned buffer if they go on to a
        GPU and no frame read before is still waiting or computing (else a pinned buffer of their own)."""
        shard, pin, place = self.peer.shard, device.pinned(self.peer.device), None
        if pin and shard is not None and msg.get("t") == "fwd" and not self.unfinished:
            try:
                place = self.inbound.view(*tensors.check(msg.get("x"), n))
            except wire.WireError:
                pass  # (landing says what is wrong with it)
        return validate.landing(msg, n, shard.hidden_size if shard else None, pin, place)

    def _compute(self, shard: Shard, passes: list, skips: list) -> tuple[tuple[dict, memoryview], float]:
        """(device runtime) This span's layers over the frame's passes and their copy back to the CPU for the wire,
        finished on the device (one event) before they are timed: trio's thread never waits for the device. The
        skipped segments are only laid out."""
        t0 = time.perf_counter()
        injected_failure(self.peer.name, "pass", self.peer.device)
        injected_slowness(self.peer.name, self.peer.st.frames)
        for skip in skips:
            shard.skip(*skip)
        hs = shard.forward(passes) if passes else [torch.empty(1, 0, shard.hidden_size, dtype=shard.dtype)]
        out = tensors.host_bytes(torch.cat(hs, dim=1) if len(hs) > 1 else hs[0], pinned=self.outbound)
        device.finish(shard.device)
        ms = (time.perf_counter() - t0) * 1e3
        return out, ms

    async def _fail(self, msg: dict, error: str, oom: bool = False, warn: bool = True, lost: bool = False) -> None:
        """The frame's failure on round the ring to the host. `lost`: only its conversations' caches here are gone
        (the host replays them; the ring is whole)."""
        if warn:
            log.warning("%s", error)
        await self._send_next({"t": "fail", "epoch": msg.get("epoch"), "sid": msg.get("sid"), "seq": msg.get("seq"),
                               "error": error, **({"oom": True, "member": self.peer.member_id} if oom else {}),
                               **({"lost": True} if lost else {})})

    async def _send_next(self, msg: dict) -> None:
        """On to the next hop; while an assign loads and wires it (or before the first), a frame waits for it
        rather than fail: the link it came on is the previous hop's, and closing that would lose every frame after
        it. The wait is the assign's, however long its load; before any plan, REWIRE_WAIT_S for one to begin."""
        with trio.move_on_after(REWIRE_WAIT_S):
            await self.wired.wait()
        if self.assigning:
            await self.wired.wait()
        if self.next is None:
            raise ChannelClosed("no next hop yet")
        await self.next.send(msg)

    async def watch_next(self, ch: Channel, epoch: int) -> None:
        """The next hop sends nothing back but an error before it closes: its link's end, while it is still this
        member's next hop, is told to the host at once (not found out by the next frame)."""
        while True:
            try:
                msg = await ch.recv(timeout=math.inf)
                why = f"the next hop said: {msg.get('error', msg['t'])}"
            except (ChannelClosed, wire.WireError) as e:
                why = str(e)
            if self.next is ch:
                log.warning("next hop lost: %s", why)
                await self.peer.link_down(epoch, "next hop", why)
            return

    @asynccontextmanager
    async def rewiring(self):
        """An assign, from its load to its new next hop: frames to send wait until it is done (or has failed)."""
        if self.wired.is_set():
            self.wired = trio.Event()
        self.assigning = True
        try:
            yield
        finally:
            self.assigning = False
            self.wired.set()

    def _gc_sessions(self) -> None:
        now = time.monotonic()
        for sid in [k for k, s in self.sessions.items() if now - s.last_used > SESSION_IDLE_S]:
            del self.sessions[sid]
