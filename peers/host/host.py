"""The ring's host (`sfchat host`): the orchestration of passes around the ring, over the members and plan it keeps.

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
from dataclasses import dataclass

import torch
import trio

from peers.models import checkpoint, source as models
from peers.compute import device, speed
from peers.links import dial as links
from peers.wire import schema as validate, codec as wire
from peers.host.batcher import MAX_BATCH, Batcher, Round
from peers.links.auth import AuthError, new_token, server_handshake
from peers.links.channel import Channel, ChannelClosed, idle_s, parse_addr, peername
from peers.base.errors import FitError, MemberLeft, RingError
from peers.models.fingerprint import config_fingerprint
from peers.compute.cpu_quant import pick_quant
from peers.compute.memory import default_device, free_bytes, pick_dtype, reset_peak, usage
from peers.plan.roster import Member, Roster, downloading
from peers.base.options import HostOptions
from peers.base.limits import CONVERSATIONS
from peers.plan.layers import ModelSize, chunk_end, chunk_positions, kv_bytes
from peers.plan.planner import Planner, Target
from peers.plan.placement import placement_of
from peers.host.stage import HostStage
from peers.host.return_link import ReturnLink
from peers.host.session import RingSession
from peers.compute.shard import load_config
from peers.base.dtypes import DTYPES
from peers.links.tls import Endpoint as TLSEndpoint
from peers.host.turns import SHARED_CHUNK, Turns

log = logging.getLogger("sfchat.host")
CANCELLED = object()  # (a pass's `failed`) a segment the members skipped because the host cancelled it


@dataclass
class Part:
    """One conversation's positions in one pass."""

    s: RingSession
    committed: int
    ids: list[int]
    parents: list[int] | None
    n_logits: int
    sent: trio.Event | None
    keep: list[int] | None = None  # columns in flight it builds on (a round in flight: peers/speculation/in_flight.py)
    round: Round | None = None

__all__ = ["Host", "Member", "RingError", "RingSession"]


class Host:
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
                                                                                       self.planner.into(m, hop)))
        size = ModelSize.of(checkpoint.read_config(self.model_dir), self.source.tensor_shapes())
        target = Target(self.source.spec, self.model_dir, self.source, self.config, self.fingerprint, self.dtype,
                        self.quant, self.device, size, opts.max_context or size.default_context(), opts.graphs,
                        opts.conversations or CONVERSATIONS, placement_of(opts.placement), opts.serving)
        self.planner = Planner(target, self.roster, offer_gb=opts.offer_gb, token=self.token, tls=self.tls,
                               on_change=self._plan_changed)
        if target.placement == "speed":  # the host's own speed, as every member times its own
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

    async def recover(self, failed_epoch: int) -> None:
        await self.planner.recover(self.port, failed_epoch)

    def _joined(self) -> None:
        if self.auto_replan:
            self.nursery.start_soon(self.planner.replan_logged, self.port)

    def _watch_speeds(self, trace: list, positions: int) -> None:
        """Each member's share of a pass, for the drift watch (peers/plan/drift.py)."""
        spans = {m.name: m.span.size for m in self.ring if m.span is not None}
        now = time.monotonic()
        for name, ms in trace:
            if name in spans:
                self.planner.drift.observe(name, ms, spans[name], positions, now)

    def between_answers(self) -> None:
        """After an answer, with no other under way: re-plan for speed if a member's speed drifted (another program
        took its cores, or gave them back), its figure scaled by how far it moved."""
        if not self.auto_replan or self.turns.passes or self.replanning or self.roster.closing \
                or self.planner.target.placement != "speed":
            return
        now = time.monotonic()
        if not (drifted := self.planner.drift.drifted(now)):
            return
        for m in self.ring:
            if m.name in drifted and not math.isnan(m.ms_per_layer):
                m.ms_per_layer *= drifted[m.name]
        log.info("re-planning for speed: %s", ", ".join(f"{name}'s passes run {x:.1f}x their first"
                                                         for name, x in drifted.items()))
        self.planner.drift.replanned(now)
        self.nursery.start_soon(self.planner.replan_logged, self.port)

    def _lost(self, m: Member) -> None:
        """A member of the ring is gone: re-plan over the rest now, not at the next pass (unless a pass's own
        recovery has done it by then)."""
        if not (self.roster.closing or m.left or m.leaving):
            self.planner.fault(m)
        if self.auto_replan and not self.roster.closing and m in self.ring:
            self.nursery.start_soon(self.planner.replan_logged, self.port, self.epoch)

    def _held(self, m: Member, seconds: float) -> None:
        """Member `m` is held out for `seconds`: where the ring re-plans by itself, it is planned in again then."""
        async def release():
            await trio.sleep(seconds)
            back = [x for x in self.roster.live() if x.name == m.name]
            if self.auto_replan and not self.roster.closing and back:
                log.info("member %d (%s) is held out no longer: re-planning", back[0].id, back[0].name)
                await self.planner.replan_logged(self.port)
        self.nursery.start_soon(release)

    def _broken(self, epoch: int) -> None:
        """A data link of the current plan broke: its passes fail at once (peers/host/return_link.py), and the ring
        is re-wired now, whether or not a pass is waiting (every member alive: the same spans, nothing reloaded)."""
        self.nursery.start_soon(self._recover_logged, epoch)

    async def _recover_logged(self, epoch: int) -> None:
        try:
            await self.recover(epoch)
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
                "share": round(self.planner.host_share, 3), "spare": False, "held_s": 0.0}
        return [host] + [self._held_info(m.info(), m) for m in self.members]

    def _held_info(self, info: dict, m: Member) -> dict:
        """A member's row, with the seconds its hold has left (peers/plan/holds.py): held, a spare says so."""
        left = self.planner.holds.left(m.name, time.monotonic())
        return info | {"held_s": round(left, 1)} | ({"state": "held"} if left and info["state"] == "spare" else {})

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

    def committed(self, s: RingSession) -> int:
        """How many of the session's positions every stage still holds; 0 after a re-plan (replay)."""
        return s.held(self.epoch)

    async def forward(self, s: RingSession, tokens: list[int], drafts: list[int],
                      sent: trio.Event | None = None, parents: list[int] | None = None) -> tuple[torch.Tensor, dict]:
        """One pass: the tokens the ring lacks plus the drafts; logits at the last token and each draft.

        The frame carries `committed`, the positions every stage keeps; each stage first trims its cache to it
        (the rollback rule), so a failed or repeated pass is harmless. `parents`: the drafts form a tree
        (peers/speculation/tree.py), not a chain. Returns (logits [K+1, vocab], timing)."""
        if self._one_frame(s, tokens, drafts):  # a round: it goes round with the other conversations' rounds
            return await self.batcher.submit(Round(s, tokens, drafts, parents, sent))
        async with self.planner.gate.share():  # other conversations' passes may be in flight too; no re-plan
            self._check(s)
            return await self._long(s, tokens, drafts, sent, parents)

    async def fly(self, r: Round) -> tuple[torch.Tensor, dict]:
        """A round in flight (peers/speculation/in_flight.py), its frame named by itself: (logits at each of its rows, timing
        with the target's argmax `best` and final features `feats` there). RingError if the ring fails it, or if
        the positions it builds on went with a re-plan."""
        return await self.batcher.submit(r)

    async def cancel(self, rounds: list[tuple[str, int]]) -> None:
        """Tell the ring that these (conversation, frame) segments are dead: a member that has not started one
        skips it (peers/member/passes.py)."""
        if rounds and self.ring and self.first_hop is not None:
            try:
                await self.first_hop.send({"t": "cancel", "epoch": self.epoch, "segments": [list(r) for r in rounds]})
            except (ChannelClosed, OSError):
                pass  # the passes themselves will fail and say why

    def _check(self, s: RingSession) -> None:
        if why := self.planner.problem():  # never an answer from part of the model
            s.lost()
            if left := [m for m in self.ring if m.left]:  # a departure, said as one (generate.py)
                raise MemberLeft(f"member {left[0].id} ({left[0].name}) left")
            raise RingError(f"the ring cannot answer: {why}")

    def _one_frame(self, s: RingSession, tokens: list[int], drafts: list[int]) -> bool:
        """A round (not a prompt or a replay, which go in chunks): it can go round with others' rounds."""
        n = len(tokens) - self.committed(s) + len(drafts)
        return 0 < n <= self.round_positions()

    def round_positions(self) -> int:
        """The positions of one conversation's round at most."""
        return min(SHARED_CHUNK, self._frame_positions())

    def _frame_positions(self) -> int:
        return chunk_positions(self.config.hidden_size, DTYPES[self.planner.target.dtype].itemsize, wire.MAX_FRAME)

    async def _run_batch(self, rounds: list[Round]) -> None:
        """(the batcher) One pass for these rounds: one frame carries as many as its size allows (a frame's worth
        of positions), the rest the next (peers/host/batcher.py). Sets each round's result or error."""
        async with self.planner.gate.share():
            ready = []
            for r in rounds:
                try:
                    self._check(r.s)
                    if r.committed is not None:  # a round in flight: its frame is what it says, or nothing
                        if len(r.tokens) > self.round_positions():
                            raise RingError(f"a round in flight of {len(r.tokens)} positions is past a frame")
                        if not r.s.fresh(self.epoch) or r.s.cache.length < r.committed:
                            raise RingError("the positions a round in flight builds on went with a re-plan")
                        ready.append(r)
                    elif self._one_frame(r.s, r.tokens, r.drafts):
                        ready.append(r)
                    else:  # a replay after a re-plan: in chunks
                        r.result = await self._long(r.s, r.tokens, r.drafts, r.sent, r.parents)
                except RingError as e:
                    r.error = e
            room = self._frame_positions()
            while ready:
                n, used = 0, 0
                while n < len(ready) and (n == 0 or used + self._positions(ready[n]) <= room):
                    used += self._positions(ready[n])
                    n += 1
                await self._rounds(ready[:n])
                ready = ready[n:]

    def _positions(self, r: Round) -> int:
        if r.committed is not None:
            return len(r.tokens)
        return len(r.tokens) - self.committed(r.s) + len(r.drafts)

    def _part(self, s: RingSession, committed: int, ids: list[int], parents, n_logits: int, sent,
              keep: list[int] | None = None, r: Round | None = None) -> Part:
        """One conversation's positions in a pass, its room checked first (a conversation past it fails alone)."""
        if committed == 0:
            s.restart(self.epoch, self.shard.new_session())
        if not self.shard.fits(committed + len(keep or []), len(ids)):
            s.lost()
            raise RingError(f"the conversation has outgrown its room: {committed + len(keep or []) + len(ids):,} "
                            f"positions, and the ring keeps {self.max_context:,} per conversation (--max-context)")
        return Part(s, committed, ids, parents, n_logits, sent, keep, r)

    async def _rounds(self, rounds: list[Round]) -> None:
        """Conversations' rounds as one pass, their logits from one run of the head."""
        t0 = time.perf_counter()
        parts, kept = [], []
        for r in rounds:
            try:
                if r.committed is not None:  # a round in flight: logits at every row
                    parts.append(self._part(r.s, r.committed, r.tokens, r.parents, len(r.tokens), r.sent, r.keep, r))
                else:
                    c = self.committed(r.s)
                    parts.append(self._part(r.s, c, r.tokens[c:] + r.drafts, r.parents, len(r.drafts) + 1, r.sent,
                                            r=r))
                kept.append(r)
            except RingError as e:
                r.error = e
        if not parts:
            return
        try:
            hs, host_ms, trace, failed = await self._pass(parts)
        except RingError as e:
            for r in kept:
                r.s.lost()
                r.error = e
            return
        t1 = time.perf_counter()
        done = [(r, p, h) for r, p, h in zip(kept, parts, hs) if h is not None]
        outs = await self.stage.head([(h[0], p.n_logits) for _, p, h in done]) if done else []
        head_ms, total_ms = (time.perf_counter() - t1) * 1e3, (time.perf_counter() - t0) * 1e3
        peers_ms = sum(ms for _, ms in trace)
        timing = {"host_ms": host_ms + head_ms, "peers": trace, "peers_ms": peers_ms, "batch": len(parts),
                  "positions": sum(len(p.ids) for p in parts),
                  "network_ms": max(total_ms - host_ms - head_ms - peers_ms, 0.0), "pass_ms": total_ms}
        self._watch_speeds(trace, timing["positions"])
        for (r, p, _), (feats, logits, best) in zip(done, outs):
            if r.committed is not None:  # its conversation's state is the round's own (peers/speculation/in_flight.py)
                r.result = (logits, {**timing, "best": best, "feats": feats})
                self.turns.went(r.s.sid)
                continue
            r.s.passed(p.committed, len(p.ids))
            r.s.features, r.s.best = (p.committed, p.ids, feats), best
            r.result = (logits, timing)
            self.turns.went(r.s.sid)
        for r in kept:
            if r.result is None and failed.get(r.s.sid) is CANCELLED:  # a member skipped it, as the host asked
                r.result = (None, timing)
            elif r.result is None:
                r.s.lost()
                r.error = RingError(str(failed.get(r.s.sid) or "a member left this conversation out of the pass"))

    async def _long(self, s: RingSession, tokens: list[int], drafts: list[int],
                    sent: trio.Event | None, parents: list[int] | None) -> tuple[torch.Tensor, dict]:
        """A long pass (a prompt, a replay) goes round in chunks that each fit a frame, the drafts in the last; each
        chunk's `committed` is what the chunks before it left in every stage (the rollback rule, chunk by chunk).
        While others answer, the chunks are short and take turns with their passes (peers/host/turns.py). The chunks'
        hidden states come back into one tensor, each straight into its place."""
        committed = self.committed(s)
        ids, n_logits = tokens[committed:] + drafts, len(drafts) + 1
        t0 = time.perf_counter()
        h, host_ms, trace, a = None, 0.0, {}, 0
        while a < len(ids):
            if a:
                await self.turns.let_others_go(s.sid, stop=lambda: self.planner.gate.replanning)
            b = chunk_end(a, len(ids), SHARED_CHUNK if self.turns.others(s.sid) else self._frame_positions(),
                          n_logits)
            last = b == len(ids)
            if h is None and not last:
                h = self._pass_buffer(len(ids))
            place = h[:, a:b] if h is not None else None
            part = self._part(s, committed + a, ids[a:b], parents if last else None, n_logits if last else 1,
                              sent if last else None)
            try:
                (out,), ms, chunk_trace, failed = await self._pass([part], place)
            except RingError:
                s.lost()
                raise
            if out is None:
                s.lost()
                raise RingError(str(failed.get(s.sid) or "a member left this conversation out of the pass"))
            if h is None:
                h = out
            elif out.data_ptr() != place.data_ptr():  # the host alone, or another dtype came back
                place.copy_(out)
            host_ms += ms
            for name, peer_ms in chunk_trace:
                trace[name] = trace.get(name, 0.0) + peer_ms
            s.passed(committed, b)
            if not last:
                self.turns.went(s.sid)
            a = b
        t1 = time.perf_counter()
        ((feats, logits, s.best),) = await self.stage.head([(h[0], n_logits)])
        s.features = (committed, ids, feats)  # what a feature draft reads next
        self.turns.went(s.sid)
        head_ms = (time.perf_counter() - t1) * 1e3
        total_ms = (time.perf_counter() - t0) * 1e3
        peers_ms = sum(trace.values())
        return logits, {"host_ms": host_ms + head_ms, "peers": [[n, ms] for n, ms in trace.items()],
                        "peers_ms": peers_ms, "network_ms": max(total_ms - host_ms - head_ms - peers_ms, 0.0),
                        "pass_ms": total_ms}

    async def _pass(self, parts: list[Part], place: torch.Tensor | None = None) -> tuple[list, float, list, dict]:
        """Conversations' positions through the host's layers and round the ring as one frame: each one's hidden
        states [1, T, H] (None where a member left it out; the last in `place`, if given and they fit it), the
        host's milliseconds, each member's, and why any was left out."""
        t0 = time.perf_counter()
        passes = [(p.s.cache, p.committed, torch.tensor([p.ids], dtype=torch.long), p.parents, p.keep) for p in parts]
        try:
            hs, (header, raw) = await self.stage.first(passes, bool(self.ring))
        except ValueError as e:  # (peers/compute/kv.py's RoomError is one) a frame its own stage cannot take: replayed
            raise RingError(str(e)) from None
        host_ms = (time.perf_counter() - t0) * 1e3
        if not self.ring:
            return hs, host_ms, [], {}
        segments = [{"sid": p.s.sid, "committed": p.committed, "n": len(p.ids), "n_logits": p.n_logits,
                     **({"parents": p.parents} if p.parents is not None else {}),
                     **({"keep": p.keep} if p.keep is not None else {})} for p in parts]
        frame = {"t": "fwd", "epoch": self.epoch, "sid": "", "committed": 0, "n_logits": 1, "batch": segments,
                 "x": header, "raw": raw, "trace": [], "seq": next(self.returns.seq)}
        for p in parts:
            if p.round is not None:
                p.round.seq = frame["seq"]
        reply = await self.returns.round_trip(frame, sum(len(p.ids) for p in parts), [p.sent for p in parts], place)
        try:
            h = validate.forward_frame(reply, self.config.hidden_size)
            back = validate.segments(reply, h.shape[1])
        except wire.WireError as e:
            raise RingError(f"the last member returned a bad frame: {e}") from None
        at = {seg["sid"]: h[:, a:b] for seg, (a, b) in zip(back, validate.bounds(back)) if not seg.get("skip")}
        failed = dict(reply.get("failed") or {}) | {seg["sid"]: CANCELLED for seg in back if seg.get("skip")}
        return [at.get(p.s.sid) for p in parts], host_ms, reply["trace"], failed

    def _pass_buffer(self, n: int) -> torch.Tensor:
        """The hidden states [1, n, hidden] of a pass that goes round in chunks: on the host's device when it is
        alone, else on the CPU (pinned for a GPU) where the last hop's bytes land."""
        dtype = DTYPES[self.planner.target.dtype]
        if not self.ring:
            return torch.empty(1, n, self.config.hidden_size, dtype=dtype, device=self.device)
        return torch.empty(1, n, self.config.hidden_size, dtype=dtype, pin_memory=device.pinned(self.device))

    async def drop(self, s: RingSession) -> None:
        self.batcher.forget(s.sid)
        await self.roster.tell(self.ring, {"t": "drop", "sid": s.sid})

    async def close(self) -> None:
        self.roster.closing = True  # members leaving from now on is the normal end, not a loss
        await self.roster.tell(self.members, {"t": "bye"}, timeout=1)
