"""The ring's host (`sfchat host`): it keeps the ring (who is in it, the plan, recovery), serves and accepts links,
and runs passes round it (peers/host/rounds.py).

The host holds the embeddings, the first span, the final norm and the LM head, so logits never cross the
network. A pass goes host -> member 1 -> ... -> member n -> host over trio TCP streams. Who is in the ring is
peers/plan/roster.py, which layers each holds is peers/plan/planner.py, the host's own layers and head
peers/host/stage.py, the replies' way back peers/host/return_link.py, and the rollback rule peers/host/session.py.
"""
from __future__ import annotations

import logging
import math
import time
import weakref

import trio

from peers.models import checkpoint, source as models
from peers.compute import device, speed
from peers.links import dial as links
from peers.wire import codec as wire
from peers.host.batcher import MAX_BATCH, Batcher
from peers.links.auth import AuthError, new_token, server_handshake
from peers.links.channel import Channel, ChannelClosed, idle_s, parse_addr, peername
from peers.base.errors import FitError, RingError
from peers.models.fingerprint import config_fingerprint
from peers.compute.cpu_quant import follow, pick_quant
from peers.compute.memory import default_device, free_bytes, pick_dtype, reset_peak, usage
from peers.plan.roster import Member, Roster, downloading
from peers.base.options import HostOptions
from peers.base.limits import CONVERSATIONS
from peers.plan.layers import ModelSize, kv_bytes
from peers.plan.planner import Planner, Target
from peers.plan.placement import placement_of
from peers.host.stage import HostStage
from peers.host.return_link import ReturnLink
from peers.host.session import RingSession
from peers.compute.loading import load_config
from peers.base.dtypes import DTYPES
from peers.links.tls import Endpoint as TLSEndpoint
from peers.host.turns import Turns
from peers.host.rounds import PassEngine
from peers.base.stalls import STALLS

log = logging.getLogger("sfchat.host")
JOIN_SETTLE_S = 1.5  # a join's re-plan comes no sooner after the last plan (trio's clock)
__all__ = ["Host", "Member", "RingError", "RingSession"]


class Host(PassEngine):
    def __init__(self, opts: HostOptions = HostOptions(), *, say=print, on_change=None):
        self.model_spec = opts.model or models.DEFAULT_MODEL
        self.token = opts.token or new_token()
        self.listen = opts.listen
        self.relay, self.relay_address = opts.relay, ""  # relay://… once registered
        self.tls = TLSEndpoint(opts.tls, "host")
        self.device = opts.device or default_device()
        self.dtype = pick_dtype(opts.dtype, self.device)
        reset_peak(self.device)
        self.say = say
        self.on_change = on_change or (lambda: None)
        self.source = models.open_source(self.model_spec, say=say)  # a hub model: only config and tokenizer yet
        self.model_dir = self.source.dir
        embedded = self.source.hub is None and self.model_dir.name == models.DEFAULT_MODEL  # (its cached dir too)
        self.quant = pick_quant(opts.quant, self.device, embedded)
        self.plan_at_start = True  # False: members are on their way; plan (and fetch) once they are here
        self.config = load_config(self.model_dir)
        self.fingerprint = config_fingerprint(self.model_dir)
        self.roster = Roster(tls=self.tls.enabled, heartbeat_s=opts.heartbeat_s, dead_after_s=opts.dead_after_s,
                             on_change=lambda: self.on_change(), on_join=self._joined, on_lost=self._lost,
                             on_link=lambda epoch, why, m, hop: self.planner.link_down(epoch, why,
                                                                                       self.planner.into(m, hop)),
                             on_quiet=lambda epoch, m, seconds: self.planner.quiet(epoch, m, seconds),
                             on_suspect=lambda m: self.nursery.start_soon(self.planner.prepare, m))
        size = ModelSize.of(checkpoint.read_config(self.model_dir), self.source.tensor_shapes())
        target = Target(self.source.spec, self.model_dir, self.source, self.config, self.fingerprint, self.dtype,
                        self.quant, self.device, size, opts.max_context or size.default_context(), opts.graphs,
                        opts.conversations or CONVERSATIONS, placement_of(opts.placement), opts.serving,
                        opts.must_hold)
        self.planner = Planner(target, self.roster, offer_gb=opts.offer_gb, token=self.token, tls=self.tls,
                               on_change=self._plan_changed)
        # the host's own speed, as every member times its own (under memory placement too: the panel shows it)
        self.planner.host_ms = speed.measure(self.device, self.dtype, self.quant, "host")
        self.planner.on_broken = self._broken
        self.planner.on_hold = self._held
        self.planner.bars = on_change is None  # download bars on the terminal, unless a screen shows the ring
        self.port = 0
        self.returns = ReturnLink(self)  # the last member's replies, to the passes waiting for them
        self.stage = HostStage(self.planner, self.device)  # the host's own layers, and the head
        self.turns = Turns()  # a long pass takes turns with other conversations' passes
        self.auto_replan = False  # `sfchat host`: re-plan as members join
        # conversations' rounds go round together, as many in a pass as every member's arena has rows for
        self.batcher = Batcher(self._run_batch, limit=min(MAX_BATCH, self.conversations),
                               in_flight=lambda: self.devices() + self.rounds_ahead)
        self.rounds_ahead = 0  # rounds conversations keep in flight beyond one each (peers/speculation/in_flight.py)
        # the conversations, while they live (by id: a RingSession, a dataclass, is not hashable)
        self.sessions: weakref.WeakValueDictionary[int, RingSession] = weakref.WeakValueDictionary()

    # the two planes the pass reads: who is in the ring, and the current plan
    members = property(lambda self: self.roster.members)
    ring = property(lambda self: self.planner.ring)
    epoch = property(lambda self: self.planner.epoch)
    shard = property(lambda self: self.planner.shard)
    first_hop = property(lambda self: self.planner.first_hop)
    max_context = property(lambda self: self.planner.target.max_context)  # what the plan made room for
    conversations = property(lambda self: self.planner.target.conversations)  # rows of every member's KV arena
    # what the app asks of the ring
    replanning = property(lambda self: self.planner.gate.replanning)  # a re-plan in progress: passes wait for it
    closing = property(lambda self: self.roster.closing)  # the host is ending the ring: a member's loss is no news
    torch_dtype = property(lambda self: DTYPES[self.dtype])

    def free_bytes(self) -> int:
        """What the host's device has free now."""
        return free_bytes(self.device)

    def set_drafter_bytes(self, n: int) -> None:
        """What a drafter's weights hold on the host: counted in every plan from now on."""
        self.planner.drafter_bytes = n

    def conversation_room(self) -> int | None:
        """How many conversations of the model's whole context the tightest stage's free memory holds in KV cache,
        or None while no stage holds layers."""
        ctx = getattr(self.config, "max_position_embeddings", 2048) or 2048
        per_layer = kv_bytes(self.planner.target.size, self.dtype, ctx)
        stages = [(self.shard.span.size if self.shard else 0, self.free_bytes())]
        stages += [(m.span.size, m.free_bytes - max(m.rss - m.rss_before, 0)) for m in self.ring]
        fits = [free // max(per_layer * n, 1) for n, free in stages if n]
        return int(min(fits)) if fits else None

    async def wait_members(self, n: int, timeout: float = 120) -> None:
        await self.roster.wait(n, timeout)

    async def replan(self) -> None:
        await self.planner.replan(self.port)

    async def recover(self, failed_epoch: int, judged: bool = False) -> None:
        await self.planner.recover(self.port, failed_epoch, judged=judged)

    def _joined(self) -> None:
        if self.auto_replan:
            self.nursery.start_soon(self._plan_in)

    async def _plan_in(self) -> None:
        """A member joined: re-plan, but not within JOIN_SETTLE_S of the last plan. A join is no emergency, and every
        re-plan replays each conversation: a member paused just past its limit, back while the conversations it
        held up replay, waits for them to have their rounds rather than making them replay again."""
        await trio.sleep_until(self.planner.planned_at + JOIN_SETTLE_S)
        await self.planner.replan_logged(self.port)

    def _watch_speeds(self, host_ms: float, trace: list, positions: int) -> None:
        """Each stage's share of a pass, for the drift watch (peers/plan/drift.py) and the check of the figures
        the plan was made with (peers/plan/calibration.py)."""
        spans = {m.name: m.span.size for m in self.ring if m.span is not None}
        now = time.monotonic()
        self.planner.calibration.observe("host", host_ms, positions)
        for name, ms in trace:
            if name in spans:
                self.planner.drift.observe(name, ms, spans[name], positions, now)
                self.planner.calibration.observe(name, ms, positions)

    def between_answers(self) -> None:
        """After an answer, with no other under way: re-plan for speed if a stage's first rounds under the plan
        showed its figure wrong, or a member's speed drifted (another program took its cores, or gave them back),
        its figure scaled by how far it was off."""
        if not self.auto_replan or self.turns.passes or self.replanning or self.roster.closing \
                or self.planner.target.placement != "speed":
            return
        now = time.monotonic()
        if off := self.planner.calibration.off():  # a figure the plan was made with, wrong from the start
            why = ", ".join(f"{name}'s layers take {x:.1f}x what its figure said" for name, x in off.items())
            self._scale_speeds(off)
            self.planner.calibration.correct(off)
        elif drifted := self.planner.drift.drifted(now):
            why = ", ".join(f"{name}'s passes run {x:.1f}x their first" for name, x in drifted.items())
            self._scale_speeds(drifted)
            self.planner.drift.replanned(now)
        else:
            return
        if self.planner.moves():
            log.info("re-planning for speed: %s", why)
            self.nursery.start_soon(self.planner.replan_logged, self.port)
        else:
            log.info("%s: the plan stays as it is (the new figures place the layers as they are)", why)

    def _scale_speeds(self, by: dict[str, float]) -> None:
        """Figures scaled by how far each stage's passes were from them ("host": the host's own)."""
        if "host" in by and not math.isnan(self.planner.host_ms):
            self.planner.host_ms *= by["host"]
        for m in self.ring:
            if m.name in by and not math.isnan(m.ms_per_layer):
                m.ms_per_layer *= by[m.name]

    def _lost(self, m: Member) -> None:
        """A member of the ring is gone: re-plan over the rest now, not at the next pass (unless a pass's own
        recovery has done it by then)."""
        if not (self.roster.closing or m.left or m.leaving):
            self.planner.faults["member_lost"] += 1
            self.planner.fault(m)
        if self.auto_replan and not self.roster.closing and m in self.ring:
            self.nursery.start_soon(self.planner.replan_logged, self.port, self.epoch)

    def _held(self, m: Member, seconds: float) -> None:
        """Member `m` is held out for `seconds`: where the ring re-plans by itself, it is planned in again then.
        While a member of the ring is silent, its loss (if it comes) plans it in: that re-plan is waited for, and
        this one made only where a plan would still move layers (each re-plan replays every conversation)."""
        async def release():
            await trio.sleep(seconds)
            while any(x.suspected and x.state != "lost" for x in self.ring):
                await trio.sleep(0.1)
            back = [x for x in self.roster.live() if x.name == m.name]
            if self.auto_replan and not self.roster.closing and back and self.planner.moves():
                log.info("member %d (%s) is held out no longer: re-planning", back[0].id, back[0].name)
                await self.planner.replan_logged(self.port)
        self.nursery.start_soon(release)

    def _broken(self, epoch: int) -> None:
        """A data link of the current plan broke: its passes fail at once (peers/host/return_link.py), and the ring
        is re-wired now, whether or not a pass is waiting (every member alive: the same spans, nothing reloaded)."""
        self.nursery.start_soon(self._recover_logged, epoch)

    async def _recover_logged(self, epoch: int) -> None:
        try:
            await self.recover(epoch, judged=True)
        except RingError as e:
            log.error("re-wiring failed: %s", e)

    def members_info(self) -> list[dict]:
        now, peak = usage(self.device)
        fetching = self.planner.fetching()
        problem = "" if self.planner.gate.replanning else self.planner.problem()
        host = {"id": 0, "name": "host", "address": self.address, "device": self.device, "dtype": self.dtype,
                "quant": self.quant,
                "layers": str(self.shard.span) if self.shard else "",
                "state": downloading(fetching) or ("waiting" if problem else "ready"), "error": problem,
                "download": fetching, "rtt_ms": 0.0,
                "memory_bytes": now, "peak_memory_bytes": peak, "free_bytes": int(self.planner.host_offer()),
                "graphs": self.shard.graphs.captured if self.shard and self.shard.graphs else 0,
                "planned_bytes": self.planner.host_planned,
                "ms_per_layer": None if self.planner.host_ms != self.planner.host_ms else round(self.planner.host_ms, 3),
                "share": round(self.planner.host_share, 3), "spare": False, "held_s": 0.0,
                "spare_layers_bytes": self.planner.spares.bytes}
        return [host] + [self._held_info(m.info(), m) for m in self.members]

    def _held_info(self, info: dict, m: Member) -> dict:
        """A member's row, with the seconds its hold has left (peers/plan/holds.py): held, a spare says so; its
        quantization the one it runs (its `auto` follows the host's)."""
        left = self.planner.holds.left(m.name, time.monotonic())
        return info | {"held_s": round(left, 1), "quant": follow(m.quant, m.device, self.quant)} | (
            {"state": "held"} if left and info["state"] == "spare" else {})

    # --- serving -------------------------------------------------------------------------------------------

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            got = await nursery.start(links.serve, self._accept, self.listen, self.relay, links.host_endpoint())
            self.port, self.relay_address = got.port, got.relay_address
            self.nursery = self.planner.nursery = nursery
            try:
                if self.plan_at_start:
                    await self.replan()  # the host alone, until members join
            except FitError as e:  # members may yet join; a host that stays alone is told at its next plan
                log.info("the host alone cannot hold the model: %s", e)
            nursery.start_soon(STALLS.run)  # this process's own stalls: excused silence, and a warning naming them
            nursery.start_soon(self.roster.heartbeat)
            nursery.start_soon(self.batcher.run)
            task_status.started(self.port)

    @property
    def address(self) -> str:
        """Where processes on this machine reach the host (the invite, sfchat/invite.py, names outward ones)."""
        host = parse_addr(self.listen)[0]
        return f"{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{self.port}"

    async def _accept(self, stream: trio.SocketStream) -> None:
        try:
            stream = await self.tls.accept(stream)
        except (OSError, trio.BrokenResourceError, trio.TooSlowError) as e:
            log.warning("TLS handshake with %s failed: %s", peername(stream), e)
            return
        ch = Channel(stream, "incoming", read_timeout=idle_s())
        try:
            hello = await server_handshake(ch, self.token, {"member": 0})
            if hello["role"] == "join":
                await self.roster.admit(ch, hello, stream)
            elif hello["role"] == "data":
                epoch = hello.get("epoch") if isinstance(hello.get("epoch"), int) else None
                try:
                    await self.returns.serve(ch)
                except (ChannelClosed, wire.WireError) as e:  # the last member's link to the host ended
                    self.planner.link_down(epoch, f"the return link: {e}")  # (into the host: no member's fault)
                    raise
            else:
                await ch.error(f"unknown role {hello['role']!r}")
        except AuthError as e:
            log.warning("%s from %s", e, peername(stream))
        except ChannelClosed as e:
            log.info("connection closed: %s", e)
        except wire.WireError as e:
            log.warning("bad frame from %s: %s", peername(stream), e)
            await ch.error(str(e))
        except Exception as e:  # one bad connection must never take the host down
            log.exception("connection from %s failed", peername(stream))
            await ch.error(f"internal error: {type(e).__name__}")
        finally:
            await ch.aclose()

    # --- one pass ------------------------------------------------------------------------------------------

    def new_session(self, sid: str) -> RingSession:
        s = RingSession(sid)
        self.sessions[id(s)] = s
        return s

    def devices(self) -> int:
        """How many separate devices compute the ring's passes (the host's own and its members')."""
        return len({device.compute_id(self.device)} | {m.compute for m in self.ring})

    def _plan_changed(self) -> None:
        """A conversation's cache of an older plan is of no more use (its next pass replays from position 0):
        it goes now, not when the conversation next speaks (an idle one might never)."""
        for s in list(self.sessions.values()):
            if s.epoch != self.epoch:
                s.cache = None
        self.on_change()

    async def drop(self, s: RingSession) -> None:
        self.batcher.forget(s.sid)
        await self.roster.tell(self.ring, {"t": "drop", "sid": s.sid})

    async def close(self) -> None:
        self.roster.closing = True  # members leaving from now on is the normal end, not a loss
        await self.roster.tell(self.members, {"t": "bye"}, timeout=1)
