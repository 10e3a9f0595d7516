"""A ring member (`sfchat join`): holds a layer span, passes hidden states on to the next hop.

Control link to the host: offer -> assign -> ready, pings, session drops.
Data link from the previous hop: fwd frames in, computed fwd frames out to the next hop.
"""
from __future__ import annotations

import logging
from collections import deque
from functools import partial
import time
from dataclasses import dataclass, field

import torch
import trio

from . import device, hub, links, models, tensors, validate, wire
from .auth import AuthError, client_handshake, server_handshake
from .channel import Channel, ChannelClosed
from .control import ControlLink
from .errors import CannotServe, ModelError
from .memory import (default_device, free_bytes, give_back, injected_failure, is_oom, oom_line, pick_dtype, rss_bytes,
                     usage)
from .options import PeerOptions
from .plan import Span
from .shard import Shard
from .tls import Endpoint as TLSEndpoint
from .fingerprint import config_fingerprint

log = logging.getLogger("sfchat.peer")
SESSION_IDLE_S = 600.0
HOST_SILENT_S = 15.0  # no ping from the host for this long: it is gone


@dataclass
class PeerState:
    """What the peer screen and the log show."""

    state: str = "connecting"
    span: Span | None = None
    device: str = "cpu"
    rss: int = 0
    peak: int = 0
    sessions: int = 0
    frames: int = 0
    compute_ms: list[float] = field(default_factory=list)
    next_hop: str = ""
    host: str = ""
    error: str = ""


class Peer:
    def __init__(self, opts: PeerOptions, *, on_change=None):
        self.host_addr, self.token, self.model_spec = opts.address, opts.token, opts.model
        self.listen, self.advertise, self.quant = opts.listen, opts.advertise, opts.quant
        self.device = opts.device or default_device()
        self.dtype = pick_dtype(opts.dtype, self.device)  # each member its own; hidden states convert at each hop
        self.offer_gb, self.name, self.graphs, self.key = opts.offer_gb, opts.name, opts.graphs, opts.key
        self.relay = links.relay_of(opts.address, opts.relay)  # also reachable through it, if any
        self.tls_pin = opts.tls_pin  # the host's certificate fingerprint from the invite: the ring uses TLS
        self.tls = TLSEndpoint(bool(opts.tls_pin), f"peer-{opts.name}")
        self.shard: Shard | None = None
        self.shard_dir = None
        self.epoch = -1
        self.sessions: dict[str, object] = {}
        # conversations the host ended: a frame of theirs still on its way (the drop on the control link overtook
        # it) must not bring their caches back
        self.dropped: deque[str] = deque(maxlen=256)
        self.next: Channel | None = None
        self.compute = trio.CapacityLimiter(1)  # one forward at a time on this device
        self.assign_lock = trio.Lock()
        self.st = PeerState(device=self.device, host=opts.address)
        self.base_bytes = 0  # what it used just before it loaded its span
        self.member_id = 0  # the host's number for it (in each assignment)
        self.cannot_serve: CannotServe | None = None  # why it left: its span cannot be had here
        self.ctl: Channel | None = None  # the control link to the host, once joined
        self.on_change = on_change or (lambda st: None)
        self.bars = on_change is None  # download bars on the terminal, unless the peer screen shows progress

    def _changed(self, **kw) -> None:
        for k, v in kw.items():
            setattr(self.st, k, v)
        self.on_change(self.st)

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            got = await nursery.start(partial(links.serve, self._serve_data, self.listen, self.relay,
                                              links.member_endpoint(self.host_addr, self.name), default_host="0.0.0.0"))
            my_port, self.advertise = got.port, self.advertise or got.relay_address or None
            stream = await TLSEndpoint.dial(await links.dial(self.host_addr), self.tls_pin)
            self.ctl = ctl = Channel(stream, "host", read_timeout=HOST_SILENT_S)  # the host pings every second
            await client_handshake(ctl, self.token, "join", name=self.name)
            offer = self.offer_gb * 2**30 if self.offer_gb is not None else free_bytes(self.device)
            await ctl.send({"t": "offer", "device": self.device, "free_bytes": int(offer), "data_port": my_port,
                            "advertise": self.advertise or "", "dtype": self.dtype, "quant": self.quant,
                            "rss_bytes": rss_bytes(), "tls_fingerprint": self.tls.fingerprint,
                            "compute": device.compute_id(self.device), "key": self.key})
            log.info("joined %s as %s; data port %d", self.host_addr, self.name, my_port)
            self._changed(state="joined")
            task_status.started(my_port)
            try:
                await self._control(ctl, nursery)
            except ChannelClosed:
                if self.cannot_serve is None:
                    raise
            finally:
                nursery.cancel_scope.cancel()
        if self.cannot_serve is not None:
            raise self.cannot_serve

    async def leave(self) -> None:
        """Tell the host this member leaves (its user stopped it): it re-plans without calling it a loss."""
        if self.ctl is not None:
            with trio.move_on_after(1):
                try:
                    await self.ctl.send({"t": "bye"})
                except ChannelClosed:
                    pass

    async def _control(self, ctl: Channel, nursery) -> None:
        async def ping(msg: dict) -> None:
            await ctl.send({"t": "pong", "n": msg.get("n"), "sessions": len(self.sessions), **self._memory()})

        async def assign(msg: dict) -> None:  # loading takes a while: keep answering pings meanwhile
            nursery.start_soon(self._take_assignment, ctl, msg)

        async def drop(msg: dict) -> None:
            self.sessions.pop(str(msg.get("sid")), None)
            self.dropped.append(str(msg.get("sid")))
            self._changed(sessions=len(self.sessions))

        try:
            await ControlLink(ctl, "member").follow({"ping": ping, "assign": assign, "drop": drop})
        except wire.WireError as e:
            return await ctl.error(str(e))
        log.info("the host closed the ring")

    async def _take_assignment(self, ctl: Channel, msg: dict) -> None:
        async with self.assign_lock:
            try:
                await self._assign(msg, ctl)
                await ctl.send({"t": "ready", "epoch": self.epoch, **self._memory()})
            except CannotServe as e:  # its span cannot be had here: say so, and leave once the host has read it
                self.cannot_serve = e  # (first: the host may hang up before the send below returns)
                await self._failed(ctl, msg, str(e), oom=e.oom, leaving=True)
                with trio.move_on_after(5):  # the host hangs up on reading it; _control then returns
                    await trio.sleep_forever()
                await ctl.aclose()
            except (wire.WireError, AuthError, OSError, ChannelClosed, ValueError) as e:  # its next hop, say
                await self._failed(ctl, msg, str(e))

    async def _failed(self, ctl: Channel, msg: dict, error: str, **flags) -> None:
        if not flags.get("leaving"):  # (one that leaves: sfchat join says why, in its last line)
            log.error("cannot take the assignment: %s", error)
        self._changed(state="failed", error=error)
        try:
            await ctl.send({"t": "fail", "epoch": msg.get("epoch"), "error": error, **flags})
        except ChannelClosed:
            pass

    def _load(self, model_dir, span: Span) -> Shard:
        injected_failure(self.name, "load", self.device)
        return Shard(model_dir, span, embed=False, head=False, dtype=self.dtype, quant=self.quant,
                     device=self.device, graphs=self.graphs)

    def _memory(self) -> dict:
        now, peak = usage(self.device)
        self._changed(rss=now, peak=peak)
        return {"memory_bytes": now, "peak_memory_bytes": peak, "base_bytes": self.base_bytes}

    async def _assign(self, msg: dict, ctl: Channel) -> None:
        epoch = validate.need(msg, "epoch", int, 0)
        self.member_id = int(msg.get("member") or 0)
        span = Span(validate.need(msg, "start", int, 0), validate.need(msg, "end", int, 0),
                    validate.need(msg, "n_layers", int, 1))
        # no --model: the host's, a hub model pinned to the commit the host resolved
        spec = self.model_spec or validate.need(msg, "model", str)
        self._changed(state="loading", span=span)
        try:
            await self._take_span(spec, span, msg, ctl)
        except Exception as e:
            while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:  # (from a fetch's nursery)
                e = e.exceptions[0]
            if is_oom(e):
                self.shard = None  # what was loaded goes back before the numbers are read
                raise CannotServe(oom_line(f"member {self.member_id} ({self.name})", self.device,
                                           f"loading layers {span}"), oom=True) from None
            if isinstance(e, ModelError):
                raise CannotServe(str(e)) from None
            log.exception("loading layers %s failed", span)
            raise CannotServe(f"cannot load layers {span} of {spec}: {type(e).__name__}: {e}") from None
        self.sessions.clear()  # a new plan invalidates every cache; the host replays committed tokens
        if self.next is not None:
            await self.next.aclose()
        nxt = validate.need(msg, "next", str)
        if nxt == "@host":  # the last member returns to the host at the address it reached it by
            nxt = links.host_return(self.host_addr, validate.need(msg, 'host_port', int, 1))
        stream = await TLSEndpoint.dial(await links.dial(nxt), msg.get("next_tls") or None)
        self.next = Channel(stream, f"next {nxt}")
        await client_handshake(self.next, self.token, "data")
        self.epoch = epoch
        self._changed(state="ready", next_hop=nxt, sessions=0)

    async def _take_span(self, spec: str, span: Span, msg: dict, ctl: Channel) -> None:
        """The model's files for `span`, checked against the host's, fetched and loaded (unless already here)."""
        source = await trio.to_thread.run_sync(lambda: models.open_source(spec, host=False, say=log.info))
        model_dir = source.dir
        mine = config_fingerprint(model_dir)
        if mine == msg.get("config_fingerprint"):
            mine = await trio.to_thread.run_sync(source.identity, span.start, span.end)
            theirs = msg.get("span_fingerprint")
        else:
            theirs = msg.get("config_fingerprint")
        if mine != theirs:
            raise ModelError(f"this peer's model ({spec}) is not the host's: its weights for layers {span} "
                                    f"differ ({mine[:12]} here, {str(theirs)[:12]} at the host); pass the same --model")
        if self.shard is None or self.shard.span != span or self.shard_dir != model_dir:
            await self._fetch(source, span, ctl)  # what this span lacks; the old span serves until it is here
            self.shard = None  # free the old span (and the caches of its layers) before loading the new one
            self.sessions.clear()
            give_back(self.device)
            self.base_bytes = usage(self.device)[0]
            t0 = time.monotonic()
            self.shard = await trio.to_thread.run_sync(self._load, model_dir, span)
            self.shard_dir = model_dir
            log.info("loaded layers %s in %.2f s", span, time.monotonic() - t0)

    async def _fetch(self, source: models.Source, span: Span, ctl: Channel) -> None:
        """Fetch the files of `span` (a hub model's), telling the host and the screen how far it got."""
        progress = hub.Progress()
        if source.hub is not None:
            log.info("fetching the files of layers %s from %s: %s", span, source.spec,
                     ", ".join(source.hub.weight_files(span.start, span.end, embed=False, head=False)))

        async def report():
            while True:
                await trio.sleep(0.5)
                if progress.active:
                    self._changed(state=progress.text())
                    await ctl.send({"t": "progress", "active": True, "file": progress.file, "total": progress.total,
                                    "done": progress.done + progress.current})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(report)
            try:
                await trio.to_thread.run_sync(lambda: source.fetch(
                    span.start, span.end, embed=False, head=False, progress=progress, bars=self.bars))
            finally:
                nursery.cancel_scope.cancel()
        if progress.total:
            log.info("fetched the files of layers %s (%.1f MB)", span, progress.total / 2**20)
            await ctl.send({"t": "progress", "active": False})
        self._changed(state="loading")

    async def _serve_data(self, stream: trio.SocketStream) -> None:
        try:
            stream = await self.tls.accept(stream)
        except (OSError, trio.BrokenResourceError, trio.TooSlowError) as e:
            log.warning("TLS handshake on a data link failed: %s", e)
            return
        ch = Channel(stream, "prev hop", read_timeout=3600)
        try:
            await server_handshake(ch, self.token)
            while True:
                msg = await ch.recv(into=self._landing)
                if msg["t"] == "fail":  # an upstream failure travels on to the host
                    await self._send_next(msg)
                    continue
                if msg["t"] != "fwd":
                    raise wire.WireError(f"unexpected {msg['t']!r} on a data link")
                await self._forward(msg)
        except (AuthError, ChannelClosed) as e:
            log.info("data link closed: %s", e)
        except wire.WireError as e:
            log.warning("bad frame from the previous hop: %s", e)
            await ch.error(str(e))
        except Exception as e:  # one bad link must never take the peer down
            log.exception("data link failed")
            await ch.error(f"internal error: {type(e).__name__}")
        finally:
            await ch.aclose()

    async def _forward(self, msg: dict) -> None:
        """One pass: of one conversation, or of several ("batch", each with its own session and rollback). A
        conversation this member cannot continue (it lacks the positions the frame says are committed) is left
        out and named in "failed"; the others go on."""
        shard = self.shard
        if shard is None:
            return await self._fail(msg, f"{self.name} holds no layers yet")
        x = validate.forward_frame(msg, shard.hidden_size)  # schema first: a bad frame closes the link
        many = "batch" in msg
        segs = validate.segments(msg, x.shape[1]) if many else [
            {"sid": msg["sid"], "committed": msg["committed"], "n": x.shape[1],
             **({"parents": msg["parents"]} if "parents" in msg else {})}]
        if msg["epoch"] != self.epoch:  # a frame of an older plan: the host will replay
            return await self._fail(msg, f"{self.name} is not on plan {msg['epoch']} but {self.epoch}")
        passes, kept, failed = [], [], dict(msg.get("failed") or {})
        for seg, (a, b) in zip(segs, validate.bounds(segs)):
            sid = seg["sid"]
            if sid in self.dropped:  # ended: its caches stay gone
                continue
            s = self.sessions.get(sid) or self.sessions.setdefault(sid, shard.new_session())
            if seg["committed"] > s.length:  # it lost its caches here (a new plan, say): the host will replay
                self.sessions.pop(sid, None)
                failed[sid] = (f"{self.name}: frame says {seg['committed']} positions are committed but this peer "
                               f"holds {s.length}")
                continue
            passes.append((s, seg["committed"], x[:, a:b], seg.get("parents")))
            kept.append(seg)
        if not passes:
            return await self._fail(msg, "; ".join(failed.values())) if failed else None
        try:
            (msg["x"], msg["raw"]), ms = await trio.to_thread.run_sync(self._compute, shard, passes,
                                                                       limiter=self.compute)
        except ValueError as e:
            for seg in kept:
                self.sessions.pop(seg["sid"], None)
            return await self._fail(msg, f"{self.name}: {e}")
        except RuntimeError as e:  # out of memory (torch.OutOfMemoryError is one): named, and the host re-plans
            if not is_oom(e):
                raise
            for seg in kept:
                self.sessions.pop(seg["sid"], None)
            return await self._fail(msg, oom_line(f"member {self.member_id} ({self.name})", self.device,
                                                  f"in a pass of {x.shape[1]} positions"), oom=True)
        if many:
            msg["batch"], msg["failed"] = kept, failed
        msg["trace"].append([self.name, round(ms, 3)])
        await self._send_next(msg)
        self._gc_sessions()
        self._changed(frames=self.st.frames + 1, sessions=len(self.sessions),
                      compute_ms=(self.st.compute_ms + [ms])[-120:])

    def _landing(self, msg: dict, n: int) -> memoryview:
        """Where a frame's hidden states land: checked first, then pinned if they go on to a GPU."""
        shard = self.shard
        return validate.landing(msg, n, shard.hidden_size if shard else None, device.pinned(self.device))

    def _compute(self, shard: Shard, passes: list) -> tuple[tuple[dict, memoryview], float]:
        """(worker thread) This span's layers over the frame's passes and their copy back to the CPU for the wire,
        finished on the device (one event) before they are timed: trio's thread never waits for the device."""
        t0 = time.perf_counter()
        injected_failure(self.name, "pass", self.device)
        hs = shard.forward_many([(s, c, x.to(shard.device, non_blocking=True), p) for s, c, x, p in passes])
        out = tensors.host_bytes(torch.cat(hs, dim=1) if len(hs) > 1 else hs[0])
        device.finish(shard.device)
        ms = (time.perf_counter() - t0) * 1e3
        return out, ms

    async def _fail(self, msg: dict, error: str, oom: bool = False) -> None:
        log.warning("%s", error)
        await self._send_next({"t": "fail", "epoch": msg.get("epoch"), "sid": msg.get("sid"), "seq": msg.get("seq"),
                               "error": error, **({"oom": True, "member": self.member_id} if oom else {})})

    async def _send_next(self, msg: dict) -> None:
        if self.next is None:
            raise ChannelClosed("no next hop yet")
        await self.next.send(msg)

    def _gc_sessions(self) -> None:
        now = time.monotonic()
        for sid in [k for k, s in self.sessions.items() if now - s.last_used > SESSION_IDLE_S]:
            del self.sessions[sid]
