"""A ring member (`sfchat join`): its control plane. Over the control link to the host: join and offer, then
assign -> load the span -> ready, pings, session drops. Its passes (fwd frames from the previous hop, computed
frames to the next) are the data plane, peers/member/passes.py.
"""
from __future__ import annotations

import logging
from functools import partial
import time
from dataclasses import dataclass, field

import torch
import trio

from peers.compute import device, speed
from peers.models import hub, source as models
from peers.links import dial as links
from peers.wire import schema as validate, codec as wire
from peers.links.auth import AuthError, client_handshake
from peers.links.liveness import keep_alive
from peers.links.channel import Channel, ChannelClosed
from peers.links.control import ControlLink
from peers.base.errors import CannotServe, ModelError, OtherModel
from peers.compute.cpu_quant import follow
from peers.compute.memory import default_device, free_bytes, give_back, injected_failure, is_oom, oom_line, pick_dtype, rss_bytes, usage
from peers.base.options import PeerOptions
from peers.member.passes import DataPlane
from peers.base.limits import CONVERSATIONS
from peers.base.span import Span
from peers.base.stalls import STALLS
from peers.compute.loading import Kept
from peers.compute.spares import Spares
from peers.compute.shard import Shard
from peers.links.tls import Endpoint as TLSEndpoint
from peers.models.fingerprint import config_fingerprint

log = logging.getLogger("sfchat.peer")
HOST_SILENT_S = 15.0  # no ping from the host for this long: said once (it is waited for while its link holds)
PING_S = 0.5  # the host pings every member this often (peers/base/options.py: heartbeat_s)


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
        self.opts = opts
        self.listen, self.advertise, self.quant = opts.listen, opts.advertise, opts.quant
        self.device = opts.device or default_device()
        self.quant_now = opts.quant  # what its layers hold: `auto` follows the host's at each assignment
        self.dtype = pick_dtype(opts.dtype, self.device)  # each member its own; hidden states convert at each hop
        self.offer_gb, self.name, self.graphs, self.key = opts.offer_gb, opts.name, opts.graphs, opts.key
        if opts.threads:  # before any pass, the timing below included
            torch.set_num_threads(opts.threads)
        self.relay = links.relay_of(opts.address, opts.relay)  # also reachable through it, if any
        self.tls_pin = opts.tls_pin  # the host's certificate fingerprint from the invite: the ring uses TLS
        self.tls = TLSEndpoint(bool(opts.tls_pin), f"peer-{opts.name}")
        self.shard: Shard | None = None
        # layers earlier plans gave it, kept (peers/compute/spares.py) within what it offers beyond its span
        self.spares = Spares(self.device, lambda: None if self.offer_gb is None else int(self.offer_gb * 2**30) - (
            self.shard.bytes() if self.shard is not None else 0))
        self.shard_dir = None
        self.epoch = -1
        self.data = DataPlane(self)  # the passes (peers/member/passes.py)
        self.assign_lock = trio.Lock()
        self.st = PeerState(device=self.device, host=opts.address)
        self.base_bytes = 0  # what it used just before it loaded its span
        self.member_id = 0  # the host's number for it (in each assignment)
        self.cannot_serve: CannotServe | None = None  # why it left: its span cannot be had here
        self.ctl: Channel | None = None  # the control link to the host, once joined
        self.host_heard = time.monotonic()  # the host's last ping
        self.nursery = None  # run()'s: the watchers of its next hop live there
        self.on_change = on_change or (lambda st: None)
        self.bars = on_change is None  # download bars on the terminal, unless the peer screen shows progress

    def _changed(self, **kw) -> None:
        for k, v in kw.items():
            setattr(self.st, k, v)
        self.on_change(self.st)

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Join the host and serve until the control link ends. Run again (sfchat join waits for its host), the
        same member keeps its layers: the host's plan finds them here and nothing is read again."""
        self.data, self.epoch, self.joined, self.cannot_serve = DataPlane(self), -1, False, None
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            got = await nursery.start(partial(links.serve, self.data.serve, self.listen, self.relay,
                                              links.member_endpoint(self.host_addr, self.name), default_host="0.0.0.0"))
            # (the flag, else this run's relay endpoint: a run after a lost host registers a new one)
            my_port, self.advertise = got.port, self.opts.advertise or got.relay_address or None
            # the link first, so a wrong address or --tls is said at once; then its speed, before the handshake
            # (the host waits for an offer only so long after a hello)
            stream = await TLSEndpoint.dial(await links.dial(self.host_addr), self.tls_pin)
            ms = await trio.to_thread.run_sync(speed.measure, self.device, self.dtype, self.quant, self.name)
            self.ctl = ctl = Channel(stream, "host", read_timeout=HOST_SILENT_S)  # (for the handshake)
            await client_handshake(ctl, self.token, "join", name=self.name)
            # from here no verdict on silence: a host paused or busy is waited for as long as its connection holds
            # (the kernel's keepalive, peers/links/channel.py, ends it when the host's machine is gone)
            ctl.read_timeout = None
            offer = self.offer_gb * 2**30 if self.offer_gb is not None else free_bytes(self.device)
            await ctl.send({"t": "offer", "device": self.device, "free_bytes": int(offer), "data_port": my_port,
                            "advertise": self.advertise or "", "dtype": self.dtype, "quant": self.quant,
                            "rss_bytes": rss_bytes(), "tls_fingerprint": self.tls.fingerprint,
                            "compute": device.compute_id(self.device), "key": self.key,
                            "ms_per_layer": ms})
            log.info("joined %s as %s; data port %d", self.host_addr, self.name, my_port)
            self.joined, self.host_heard = True, time.monotonic()
            self._changed(state="joined")
            task_status.started(my_port)
            nursery.start_soon(STALLS.run)  # this process's own stalls: excused silence, and a warning naming them
            nursery.start_soon(self._host_silence)
            try:
                await self._control(ctl, nursery)
            except ChannelClosed:
                if self.cannot_serve is None:
                    raise
            finally:
                nursery.cancel_scope.cancel()
        if self.cannot_serve is not None:
            raise self.cannot_serve

    def host_silent(self) -> bool:
        """Whether the host has not pinged for a while: then a data link's silence is the host's (paused, busy),
        not the link's (peers/member/passes.py)."""
        return time.monotonic() - self.host_heard > 4 * PING_S

    async def _host_silence(self) -> None:
        """Say once when the host goes silent for HOST_SILENT_S, and once when it is heard again."""
        said = False
        while True:
            await trio.sleep(1)
            silent = time.monotonic() - self.host_heard
            if silent > HOST_SILENT_S and not said:
                log.warning("the host has said nothing for %.0f s (paused or busy?): waiting for it, layers kept", silent)
                self._changed(state="waiting for the host")
            elif said and silent < HOST_SILENT_S:
                log.warning("the host is back")
                self._changed(state="ready" if self.shard is not None else "joined")
            said = silent > HOST_SILENT_S

    async def link_down(self, epoch: int | None, hop: str, error: str) -> None:
        """Tell the host a data link of plan `epoch` broke here, so it re-wires now rather than at a pass timeout."""
        if self.ctl is None or epoch is None:
            return
        try:
            with trio.move_on_after(2):
                await self.ctl.send({"t": "link", "epoch": epoch, "hop": hop, "error": error[:300]})
        except ChannelClosed:
            pass

    async def quiet(self, epoch: int | None, hop: str, seconds: float) -> None:
        """Tell the host a data link of plan `epoch` has been silent here for `seconds`: it judges whether that is
        the link (the member writing into it answers its pings) or that member (it does not: its heartbeat says)."""
        if self.ctl is None or epoch is None or self.host_silent():
            return
        try:
            with trio.move_on_after(1):
                await self.ctl.send({"t": "quiet", "epoch": epoch, "hop": hop, "s": round(seconds, 2)})
        except ChannelClosed:
            pass

    async def leave(self) -> None:
        """Tell the host this member leaves (its user stopped it): it re-plans without calling it a loss."""
        if self.ctl is not None:
            with trio.move_on_after(1):
                try:
                    await self.ctl.send({"t": "bye"})
                except ChannelClosed:
                    pass

    async def _control(self, ctl: Channel, nursery) -> None:
        async def ping(msg: dict) -> None:  # answered from trio while a pass computes in its thread
            self.host_heard = time.monotonic()
            busy = self.data.computing
            await ctl.send({"t": "pong", "n": msg.get("n"), "sessions": len(self.data.sessions),
                            **({"computing": busy[0], "computing_s": time.monotonic() - busy[1]} if busy else {}),
                            "frames": self.st.frames, "graphs": self.shard.graphs.captured if self.shard and
                            self.shard.graphs else 0, **self._memory()})

        async def assign(msg: dict) -> None:  # loading takes a while: keep answering pings meanwhile
            nursery.start_soon(self._take_assignment, ctl, msg)

        async def drop(msg: dict) -> None:
            self.data.drop(str(msg.get("sid")))
            self._changed(sessions=len(self.data.sessions))

        async def warm(msg: dict) -> None:
            nursery.start_soon(self._warm, msg)

        try:
            await ControlLink(ctl, "member").follow({"ping": ping, "assign": assign, "drop": drop, "warm": warm})
        except wire.WireError as e:
            return await ctl.error(str(e))
        log.info("the host closed the ring")

    async def _warm(self, msg: dict) -> None:
        """The host expects a plan that gives this member the layers start..end (another member went silent): those
        it lacks loaded as spares now (peers/compute/spares.py). Nothing is lost if it cannot."""
        shard = self.shard
        if shard is None or not all(isinstance(msg.get(k), int) for k in ("start", "end")):
            return
        try:
            span = Span(msg["start"], msg["end"], shard.span.n_layers)
            await self.spares.warm(span, shard.held(), shard.loaded_as, shard.config)
        except Exception as e:  # noqa: BLE001 - (the re-plan loads what is missing, as ever)
            log.debug("warming up layers %s-%s failed: %s", msg["start"], msg["end"], e)

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

    def _load(self, model_dir, span: Span, room: tuple[int | None, int], kept: Kept | None = None) -> Shard:
        injected_failure(self.name, "load", self.device)
        return Shard(model_dir, span, embed=False, head=False, dtype=self.dtype, quant=self.quant_now,
                     device=self.device, graphs=self.graphs, context=room[0], conversations=room[1], kept=kept)

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
        self.quant_now = follow(self.quant, self.device, str(msg.get("quant") or "none"))  # (auto: the host's)
        # frames to send wait from here until the new next hop is wired: the old plan is over, whatever its
        # next hop was, and the previous hop's link must not close under them, however long the load takes
        async with self.data.rewiring():
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
                    raise CannotServe(str(e), other_model=isinstance(e, OtherModel)) from None
                log.exception("loading layers %s failed", span)
                raise CannotServe(f"cannot load layers {span} of {spec}: {type(e).__name__}: {e}") from None
            self.data.sessions.clear()  # a new plan invalidates every cache; the host replays committed tokens
            if (old := self.data.next) is not None:
                self.data.next = None
                await old.aclose()
            nxt = validate.need(msg, "next", str)
            if nxt == "@host":  # the last member returns to the host at the address it reached it by
                nxt = links.host_return(self.host_addr, validate.need(msg, 'host_port', int, 1))
            stream = await TLSEndpoint.dial(await links.dial(nxt), msg.get("next_tls") or None)
            nch = Channel(stream, f"next {nxt}")
            await client_handshake(nch, self.token, "data", epoch=epoch)
            await self.nursery.start(keep_alive, nch)  # its reader takes silence for a dead link
            self.data.next = nch
            self.nursery.start_soon(self.data.watch_next, nch, epoch)
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
            raise OtherModel(f"this peer's model ({spec}) is not the host's: its weights for layers {span} "
                                    f"differ ({mine[:12]} here, {str(theirs)[:12]} at the host); pass the same --model")
        room = (msg.get("max_context") if isinstance(msg.get("max_context"), int) else None,
                max(1, int(msg.get("conversations") or CONVERSATIONS)))  # the KV arena the plan counted
        shard = self.shard
        same = shard is not None and (shard.span, self.shard_dir, shard.context, shard.arena.rows) == (
            span, model_dir, *room)
        if not same:
            await self._fetch(source, span, ctl)  # what this span lacks; the old span serves until it is here
            kept = None
            await self.spares.settled()
            if shard is not None:
                kept = shard.keep(span, embed=False, head=False)  # its layers the new span has: not read again
                kept = self.spares.trade(kept, shard.held(), span)  # (and what it took back from the spares)
                shard.close()
            self.shard = shard = None  # free the rest of the old span (and its caches) before loading the new one
            self.data.sessions.clear()
            give_back(self.device)
            self.base_bytes = usage(self.device)[0]
            t0 = time.monotonic()
            self.shard = await trio.to_thread.run_sync(self._load, model_dir, span, room, kept)
            del kept
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
