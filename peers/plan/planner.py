"""Planning and loading: split the layers over the host and the live members (peers/plan/layers.py), load the host's
span, have each member load its own, and wire the ring in pass order.

Each plan is a new epoch. Frames carry the epoch they were made under, and every stage's caches belong to one
epoch: after a re-plan each conversation replays its committed tokens (peers/host/session.py).
"""
from __future__ import annotations

import logging
from collections import Counter
import math
import time
from dataclasses import dataclass
from pathlib import Path

import trio

from peers.models import hub, source as models
from peers.links import dial as links
from peers.links.auth import AuthError, client_handshake
from peers.links.liveness import KEEPALIVE_S, keep_alive
from peers.links.channel import Channel, ChannelClosed
from peers.wire.codec import WireError
from peers.base.errors import FitError, ModelError, RingError
from peers.base.stalls import STALLS
from peers.plan.roster import Member, Roster
from peers.plan.calibration import HOST, Calibration
from peers.plan.drift import Drift
from peers.plan.holds import Holds
from peers.plan.gate import PassGate
from peers.compute.memory import free_bytes, give_back
from peers.base.limits import CONVERSATIONS
from peers.compute.cpu_quant import follow
from peers.plan.layers import (QUANT_BYTES, ModelSize, Offer, covers, host_bytes, plan, planned_bytes, predicted_ms,
                               scale)
from peers.compute.shard import Shard
from peers.compute.spares import Spares
from peers.base.dtypes import DTYPES
from peers.base.span import Span
from peers.links.tls import Endpoint as TLSEndpoint

log = logging.getLogger("sfchat.host")
LINK_GRACE_S = 0.3  # a broken link is judged this long after it is told: a member's bye or loss comes first
# a writer that answered a ping sent this long after its link went silent ran when its next keepalive was due
# (KEEPALIVE_S), with a margin for the keepalive's way
HEARD_AFTER_S = KEEPALIVE_S + 0.25


@dataclass(frozen=True)
class Target:
    """The model the ring runs, and how the host loads its own part of it."""

    spec: str  # what members are told: what the user named, a hub id pinned to the host's commit
    dir: Path
    source: models.Source  # where the host gets the files of its span (a hub model: fetched as needed)
    config: object
    fingerprint: str
    dtype: str
    quant: str
    device: str
    size: ModelSize  # what the plan weighs (peers/plan/layers.py)
    max_context: int
    graphs: bool = True  # CUDA graphs of the host's short passes
    conversations: int = CONVERSATIONS  # rows of every member's KV arena (peers/compute/kv.py)
    placement: str = "speed"  # or "memory" (peers/plan/placement.py)
    serving: bool = False  # many conversations in flight: the busiest stage is what the plan weighs
    must_hold: tuple[str, ...] = ()  # members the user asked for in the ring (--local-peers): each holds layers


class Planner:
    """The current plan: the host's shard, the members holding layers in pass order, and the link to the first."""

    def __init__(self, target: Target, roster: Roster, *, offer_gb: float | None, token: str, tls: TLSEndpoint,
                 on_change):
        self.target, self.roster, self.offer_gb = target, roster, offer_gb
        self.token, self.tls, self.on_change = token, tls, on_change
        self.shard: Shard | None = None
        self.ring: list[Member] = []  # members with layers, in pass order
        self.epoch = 0
        self.first_hop: Channel | None = None
        self.gate = PassGate()  # passes share the ring, a re-plan waits for them and has it alone
        self.drafter_bytes = 0  # what a drafter built before the plan holds on the host
        self.host_planned = 0  # what the plan counts for the host's own part
        self.download = hub.Progress()  # the host's own fetch, for its row in the ring panel
        self.bars = True  # download bars on the terminal (not under a screen that shows the ring)
        self.left_out: list[str] = []  # why members were left out since the last plan that held, for a FitError
        self.planned = 0  # the last epoch handed out (a failed try's too)
        self.planned_at = -math.inf  # when the last plan was wired (trio's clock)
        self.why = ""  # why the last re-plan failed: the ring answers nothing until one succeeds
        self.host_ms = math.nan  # the host's own measured ms per reference layer (peers/compute/speed.py)
        self.host_share = 0.0  # its part of the predicted time per token
        self.predicted_ms = math.nan  # the current plan's predicted ms per token (one conversation)
        self.drift = Drift()  # each member's pass times against its baseline under this plan (peers/plan/drift.py)
        self.calibration = Calibration()  # each stage's first rounds against its figure (peers/plan/calibration.py)
        self.broken: dict[int, str] = {}  # plans a data link of broke, and how: their passes fail, a re-wire follows
        self.nursery = None  # the host's: the watcher of the first hop lives there
        self.on_broken = lambda epoch: None  # the host's recovery
        self.faults: Counter[str] = Counter()  # by kind (member_lost, link_broken, replan_failed), for /metrics
        self.holds = Holds()  # members that broke twice within a minute: no layers for a while (peers/plan/holds.py)
        # layers earlier plans gave the host, kept (peers/compute/spares.py) within what it offers beyond its plan
        self.spares = Spares(target.device, lambda: None if self.offer_gb is None
                             else self.host_offer() - self.host_planned)
        self.on_hold = lambda m, seconds: None  # the host's: a member was just held out for `seconds`

    def host_offer(self) -> int:
        """What the host offers, the embedding, head and drafter included (the plan takes them off)."""
        return int(self.offer_gb * 2**30) if self.offer_gb is not None else free_bytes(self.target.device)

    def offers(self, live: list[Member], holds: bool = True, at: float | None = None) -> list[Offer]:
        """What the host and each live member offer the plan; a member held out (`holds`) at `at` (monotonic
        seconds; now by default) offers nothing."""
        t, now = self.target, time.monotonic() if at is None else at
        return [Offer("host", self.host_offer(), t.dtype, t.quant, self.host_ms,
                      cuda=str(t.device).startswith("cuda"))] + [
            Offer(f"member {m.id} ({m.name})", 0 if holds and self.holds.held(m.name, now) else m.free_bytes,
                  m.dtype if m.dtype in DTYPES else "float32",
                  q if (q := follow(m.quant, m.device, t.quant)) in QUANT_BYTES else "none", m.ms_per_layer,
                  0.0 if math.isnan(m.rtt_ms) else m.rtt_ms, must=m.name in t.must_hold) for m in live]

    def how(self) -> str:
        """How the split is chosen, in words (the ring panel's)."""
        t = self.target
        if t.placement == "memory":
            return "layers split in proportion to the memory each offers (--placement memory)"
        if t.must_hold and any(m.name in t.must_hold for m in self.roster.live()):
            return ("layers split by measured speed, every local peer holding some: the busiest stage evened out "
                    "(--placement speed makes local peers spares where they only add time)")
        if t.serving:
            return "layers split by measured speed: the busiest stage evened out (many conversations)"
        return "layers where they compute fastest: the least predicted time per token (--placement speed)"

    def problem(self) -> str:
        """Why the ring cannot answer now, or '' when it can: its spans must hold every layer exactly once, in pass
        order, each member ready under the current plan. Checked before every pass, so an answer is never computed
        by part of the model."""
        if self.shard is None:
            return self.why or "the host holds no layers yet"
        spans = [self.shard.span] + [m.span for m in self.ring]
        if not covers(spans, self.target.size.n_layers):
            return self.why or "the ring's layers " + ", ".join(map(str, spans)) + " do not cover the model"
        for m in self.ring:
            if m.state != "ready" or m.epoch != self.epoch:
                return self.why or f"member {m.id} ({m.name}) is {m.state}" + (f": {m.error}" if m.error else "")
        return self.broken.get(self.epoch, "")

    def link_down(self, epoch: int | None, why: str, into: Member | None = None) -> None:
        """A data link of plan `epoch` broke (a member said so, or the host's own first hop or return link ended):
        if that is the current plan, its passes fail now (peers/host/return_link.py) and the ring is re-wired.
        A link of an older plan ending is the re-plan that replaced it. `into`: the member the link led into."""
        if epoch != self.epoch or epoch in self.broken or not self.ring or self.roster.closing:
            return
        if self.nursery is not None:
            self.nursery.start_soon(self._break, epoch, why, into)

    def quiet(self, epoch: int, m: Member, seconds: float) -> None:
        """Member `m`'s link from the stage before it has been silent for `seconds` (peers/links/liveness.py): that
        link is dead if its writer ran all along, the host itself (not stalled meanwhile) or a member that answered
        a ping the host sent after the writer's next keepalive was due (the ping's time, not the pong's: a pong
        read late says nothing of when its member ran); a writer not heard from since is its heartbeat's to judge
        (stopped, not cut off)."""
        if epoch != self.epoch or m not in self.ring or STALLS.within(seconds):
            return
        i = self.ring.index(m)
        writer = self.ring[i - 1] if i else None
        silent_since = time.monotonic() - seconds
        if writer is not None and (writer.state != "ready" or writer.answered - silent_since < HEARD_AFTER_S):
            return
        who = "the host" if writer is None else f"member {writer.id} ({writer.name})"
        self.link_down(epoch, f"member {m.id} ({m.name}): its prev hop link has been silent for {seconds:.1f} s "
                              f"while {who} runs", m)

    async def prepare(self, m: Member) -> None:
        """Member `m`, holding layers, has gone silent: the host and each member load as spares what a plan without
        it would give them (peers/compute/spares.py), so its loss, if it comes, reads nothing. The ring waits on
        it meanwhile: its cores are free."""
        if m not in self.ring or self.gate.replanning or self.shard is None:
            return
        live = [x for x in self.roster.live() if x is not m]
        # the plan its loss would make: a member whose hold ends before then is planned in by it
        now = time.monotonic()
        lost_at = now + max(m.silent_limit(self.roster.dead_after_s) - (now - m.last_seen), 0.0)
        try:
            spans = self._plan(live, at=lost_at)
        except FitError:
            return
        log.debug("member %d (%s) is silent: the others warm up (%s)", m.id, m.name, ", ".join(
            f"{getattr(x, 'name', x)} {s}" for x, s in zip(["host"] + live, spans) if s.size))
        for x, s in zip(live, spans[1:]):
            if s.size and x.state == "ready":
                await self.roster.tell([x], {"t": "warm", "start": s.start, "end": s.end}, timeout=1)
        shard = self.shard
        try:
            await self.spares.warm(spans[0], shard.held(), shard.loaded_as, self.target.config)
        except Exception as e:  # noqa: BLE001 - (the re-plan loads what is missing, as ever)
            log.debug("warming up layers %s failed: %s", spans[0], e)

    def fault(self, m: Member) -> None:
        """Member `m` was lost, or the link into it broke: held out for a while if that is twice within a minute."""
        if seconds := self.holds.fault(m.name, time.monotonic()):
            log.warning("member %d (%s) broke twice within a minute: no layers for it for %.0f s", m.id, m.name,
                        seconds)
            self.on_hold(m, seconds)

    def into(self, m: Member, hop: str) -> Member | None:
        """The member a link that member `m` reported broken led into: itself for its previous hop's, the next
        ring member for its next hop's (none where that is the host's return link)."""
        if hop == "prev hop":
            return m
        i = next((i for i, r in enumerate(self.ring) if r is m), None)
        return self.ring[i + 1] if hop == "next hop" and i is not None and i + 1 < len(self.ring) else None

    async def _break(self, epoch: int, why: str, into: Member | None = None) -> None:
        """A moment first: a member that leaves (Ctrl+C) or dies closes its links as its control link says so, and
        that is a departure or a loss, re-planned as one (peers/plan/roster.py), not a broken link."""
        await trio.sleep(LINK_GRACE_S)
        if epoch != self.epoch or epoch in self.broken or self.roster.closing:
            return
        if gone := [m for m in self.ring if m.left or m.state == "lost"]:
            return log.info("a link of plan %d broke as member %d left or was lost", epoch, gone[0].id)
        self.broken = {epoch: f"a link of plan {epoch} broke: {why}"}
        self.faults["link_broken"] += 1
        if into is not None:
            self.fault(into)
        if self.gate.replanning:  # the re-plan under way replaces it (and may have closed that link itself)
            return log.info("%s", self.broken[epoch])
        log.warning("%s; re-wiring", self.broken[epoch])
        self.on_change()
        self.on_broken(epoch)

    async def _watch(self, ch: Channel, epoch: int) -> None:
        """The first member sends nothing back on its link but an error before it closes: the link's end is news."""
        try:
            msg = await ch.recv(timeout=math.inf)
            why = f"the first member said: {msg.get('error', msg['t'])}"
        except (ChannelClosed, WireError) as e:
            why = str(e)
        if self.first_hop is ch:
            self.link_down(epoch, f"the first hop: {why}", self.ring[0] if self.ring else None)

    def healthy(self) -> bool:
        return not self.problem()

    async def replan(self, host_port: int, *, unless_past: int | None = None) -> None:
        """Split the layers over the host and every live member, load, and wire the ring. A member that cannot
        take its span (a failed download or load, out of memory, gone) is left out and the rest planned again, so
        the host takes back its layers where it can; where the rest cannot hold the model, FitError, and passes
        are refused (problem()) until a plan succeeds. `unless_past`: a failed pass's epoch; nothing to do if
        another conversation's recovery has re-formed the ring since."""
        asked = time.monotonic()
        async with self.gate.alone():
            self.phases = {"drained": time.monotonic() - asked}
            if unless_past is not None and self.epoch > unless_past and self.healthy():
                return
            try:
                while not await self._replan(host_port):
                    pass
            except Exception as e:  # noqa: BLE001 - recorded for problem(), then raised as it was
                self.why = str(e) or type(e).__name__
                self.on_change()
                raise
            self.why, self.left_out = "", []

    def _leave_out(self, bad: list[Member]) -> None:
        """Members that did not take their spans are out of the next plan, except one that failed beside a lost
        one (its next hop, say): that is planned in again, and fails the next plan alone if the fault was its own."""
        beside_lost = any(m.state == "lost" for m in bad)
        for m in bad:
            if beside_lost and m.state != "lost" and not m.oom and not m.leaving:
                m.state, m.error = "joining", ""
                continue
            if m.state != "lost":
                m.state = "failed"
            self.left_out.append(m.error if m.oom else f"member {m.id} ({m.name}): {m.error or m.state}")
            say_left_out(m)

    async def _replan(self, host_port: int) -> bool:
        """One plan; False if members could not take their spans (out of the next)."""
        t = self.target
        live = self.roster.live()
        # in bytes, before anything is loaded: a ring that cannot hold the model says so now (FitError)
        try:
            spans = self._rewire(live) or self._plan(live)
        except FitError as e:
            if self.left_out:  # say why the ring is smaller than it was
                raise FitError("; ".join(self.left_out) + f"; the rest of the ring {e}",
                               host_short=e.host_short) from None
            raise
        await self._fetch_own(spans[0])  # before anything changes: a failed fetch leaves the ring as it was
        self.planned = epoch = max(self.planned, self.epoch) + 1  # a new number each try: no late "ready" counts
        ring = sorted((m for m, s in zip(live, spans[1:]) if s.size), key=lambda m: spans[1 + live.index(m)].start)
        offers = self.offers(live, holds=False)
        self._predict(offers, spans, live)
        planned = [planned_bytes(t.size, o, s, t.max_context, t.conversations) for o, s in zip(offers, spans)]
        self.host_planned = planned[0] + host_bytes(t.size, t.dtype, self.drafter_bytes)
        for m, s, b in zip(live, spans[1:], planned[1:]):
            m.assign(s, epoch)
            m.planned_bytes = b
        self.on_change()
        t0 = time.monotonic()
        if bad := await self._assign_and_load(ring, epoch, host_port, spans[0]):
            self._leave_out(bad)
            return False
        self.phases["loaded"] = time.monotonic() - t0
        if (unreachable := await self._wire_first_hop(ring, epoch)) is not None:
            self._leave_out([unreachable])
            return False
        self.ring, self.epoch, self.planned_at = ring, epoch, trio.current_time()
        self.drift.reset()  # new spans, new neighbours: new baselines
        k = scale(t.size)
        self.calibration.planned({HOST: (spans[0].size, self.host_ms * k)} | {
            m.name: (m.span.size, m.ms_per_layer * k) for m in ring}, [HOST] + [m.name for m in live])
        if self.first_hop is not None and self.nursery is not None:
            self.nursery.start_soon(self._watch, self.first_hop, epoch)
            await self.nursery.start(keep_alive, self.first_hop)  # the first member takes silence for a dead link
        spares = [m for m in live if m.state == "spare"]
        self.phases["wired"] = time.monotonic() - t0
        log.debug("re-plan %d: %s", epoch, ", ".join(f"{k} after {v:.2f} s" for k, v in self.phases.items()))
        log.info("ring epoch %d: host %s%s%s; %s placement%s", epoch, spans[0],
                 "".join(f" -> member {m.id} {m.span}" for m in ring),
                 "".join(f", member {m.id} spare" for m in spares), t.placement,
                 "" if math.isnan(self.predicted_ms) else f", predicted {self.predicted_ms:.1f} ms per token")
        self.on_change()
        return True

    async def _assign_and_load(self, ring: list[Member], epoch: int, host_port: int, span: Span) -> list[Member]:
        """The members load their spans while the host loads its own (a loss costs the longest of the loads, not
        their sum); the members that did not get ready. A plan that fails on the way leaves the host holding
        its new span: the next plan keeps what it can of it."""
        bad, error = [], None
        async with trio.open_nursery() as nursery:
            async def members():
                nonlocal bad
                bad = await self._assign(ring, epoch, host_port)
            nursery.start_soon(members)
            try:
                await self._load_own(span)
            except Exception as e:  # (raised below, outside the nursery: as itself, not in a group)
                error = e
        if error is not None:
            raise error
        return bad

    async def _assign(self, ring: list[Member], epoch: int, host_port: int) -> list[Member]:
        """Each ring member told its span and next hop under `epoch`; the members that did not get ready."""
        t = self.target
        for i, m in enumerate(ring):
            nxt = ring[i + 1].data_addr if i + 1 < len(ring) else "@host"
            pin = ring[i + 1].tls_fingerprint if i + 1 < len(ring) else self.tls.fingerprint
            try:
                await m.ctl.send({"t": "assign", "epoch": epoch, "member": m.id, "model": t.spec,
                                  "config_fingerprint": t.fingerprint,
                                  "span_fingerprint": await trio.to_thread.run_sync(
                                      t.source.identity, m.span.start, m.span.end),
                                  "start": m.span.start,
                                  "end": m.span.end, "n_layers": m.span.n_layers, "next": nxt, "next_tls": pin,
                                  "host_port": host_port, "max_context": t.max_context,
                                  "conversations": t.conversations, "quant": t.quant})
            except ChannelClosed:
                m.state = "lost"
        for m in ring:
            with trio.move_on_after(600):
                await m.ready.wait()
        return [m for m in ring if m.state != "ready"]

    async def _load_own(self, span: Span) -> None:
        """The host's own span, with the embedding and head: only the layers it does not hold yet are read."""
        t = self.target
        if self.shard is not None and self.shard.span == span:
            return
        kept = None
        await self.spares.settled()
        if self.shard is not None:
            kept = self.shard.keep(span, embed=True, head=True)  # what the new span has: not read again
            kept = self.spares.trade(kept, self.shard.held(), span)  # (and what it took back from the spares)
            self.shard.close()
        self.shard = None  # free the rest of the old span before loading the new one
        give_back(t.device)
        self.shard = await trio.to_thread.run_sync(
            lambda: Shard(t.dir, span, embed=True, head=True, dtype=t.dtype, quant=t.quant, device=t.device,
                          graphs=t.graphs, context=t.max_context, conversations=t.conversations, kept=kept))

    async def _wire_first_hop(self, ring: list[Member], epoch: int) -> Member | None:
        """The host's link to the first member under `epoch` (none for a ring of the host alone); the first
        member where it cannot be reached (gone since it said ready, or not where it says it listens)."""
        if (old := self.first_hop) is not None:
            self.first_hop = None  # (first: its watcher says nothing of a link closed here)
            await old.aclose()
        if not ring:
            return None
        try:
            stream = await TLSEndpoint.dial(await links.dial(ring[0].data_addr), ring[0].tls_fingerprint)
            self.first_hop = Channel(stream, "first hop")
            await client_handshake(self.first_hop, self.token, "data", epoch=epoch)
        except (OSError, AuthError, ChannelClosed, trio.BrokenResourceError) as e:
            self.first_hop = None
            m = ring[0]
            if m.state != "lost":
                m.state, m.error = "failed", f"cannot be reached at {m.data_addr}: {e}"
            return m
        return None

    def _plan(self, live: list[Member], at: float | None = None) -> list:
        """Spans for the host and `live`, the members held out at `at` (now by default) given none; where the rest
        cannot hold the model without them, they are planned in all the same."""
        t = self.target
        try:
            return plan(t.size, self.offers(live, at=at), t.max_context, self.drafter_bytes, t.conversations,
                        t.placement, t.serving)
        except FitError:
            if self.offers(live, at=at) == self.offers(live, holds=False):
                raise
            log.info("the ring cannot hold the model without the members held out: planned in all the same")
            return plan(t.size, self.offers(live, holds=False), t.max_context, self.drafter_bytes, t.conversations,
                        t.placement, t.serving)

    def moves(self) -> bool:
        """Whether a plan now, by the figures as they are, would move layers: a corrected figure that changes
        nothing is no reason to re-plan (a new epoch: every conversation replays)."""
        live = self.roster.live()
        try:
            spans = self._plan(live)
        except FitError:
            return True
        def held(span): return span if span is not None and span.size else None
        now = [self.shard.span if self.shard else None] + [m.span if m in self.ring else None for m in live]
        return [held(s) for s in spans] != [held(s) for s in now]

    def _predict(self, offers: list[Offer], spans: list, live: list[Member]) -> None:
        """The plan's predicted ms per token, and each stage's share of it (nan where someone did not measure)."""
        self.predicted_ms = predicted_ms(self.target.size, offers, spans)
        parts = [s.size * o.ms_per_layer * scale(self.target.size) + (o.link_ms if s.size else 0.0)
                 for o, s in zip(offers, spans)]
        total = sum(parts)
        shares = [p / total if total > 0 and not math.isnan(total) else 0.0 for p in parts]
        self.host_share = shares[0]
        for m, share in zip(live, shares[1:]):
            m.share = share

    def _rewire(self, live: list[Member]) -> list | None:
        """The current plan's spans again, when only a link of it broke and its members are the ones alive: a
        re-wiring under a new epoch, nothing moved or reloaded (a new split would reload, and a host whose free
        memory moved a little would split differently). None where a plan must be made."""
        if self.epoch not in self.broken or self.shard is None:
            return None
        held = {m.id: m.span for m in self.ring}
        if {m.id for m in live if m.span is not None and m.span.size} != set(held) or any(
                m.span != held.get(m.id) and m.span.size for m in live):
            return None
        return [self.shard.span] + [m.span if m.id in held else Span(0, 0, self.target.size.n_layers) for m in live]

    async def _fetch_own(self, span) -> None:
        """The files of the host's span, embedding, norm and head (a hub model's: fetched if missing)."""
        try:
            await trio.to_thread.run_sync(lambda: self.target.source.fetch(
                span.start, span.end, embed=True, head=True, progress=self.download, bars=self.bars))
        except ModelError as e:
            raise RingError(str(e)) from None
        finally:
            self.on_change()

    def fetching(self) -> dict | None:
        d = self.download
        return {"file": d.file, "done": d.done + d.current, "total": d.total} if d.active else None

    async def replan_logged(self, host_port: int, unless_past: int | None = None) -> None:
        try:
            await self.replan(host_port, unless_past=unless_past)
        except RingError as e:
            self.faults["replan_failed"] += 1
            log.error("re-plan failed: %s", e)

    async def recover(self, host_port: int, failed_epoch: int, attempts: int = 5, judged: bool = False) -> None:
        """After a pass under `failed_epoch` failed: re-plan over the members still alive (the host takes what is
        left, as memory allows); each session then replays its committed tokens in one prefill on its next pass.
        Every conversation in flight sees the failure; the first to get here re-plans for all of them. A moment
        first, for a loss behind the failure to be heard, unless the fault is `judged` already (a broken link,
        after its grace)."""
        for i in range(attempts):
            await trio.sleep(0.2 * (i if judged else i + 1))
            try:
                return await self.replan(host_port, unless_past=failed_epoch)
            except FitError:  # the members left cannot hold the model: no retry helps
                raise
            except RingError as e:  # a member failed while loading: it is excluded from the next plan
                self.faults["replan_failed"] += 1
                log.warning("re-plan failed: %s", e)
        raise RingError(f"could not re-form the ring after {attempts} attempts")


def say_left_out(m: Member) -> None:
    """One line for a member planned out: why it cannot serve; a joiner that tries again (--stay) and fails the same
    way is said once more, as "still", then no more. A lost member's loss was said when it happened."""
    if m.state == "lost" and not m.leaving:
        log.debug("member %d (%s) left out of the ring: %s", m.id, m.name, m.error or m.state)
    elif m.error and m.error == m.failed_before:
        if not m.said_still:
            log.warning("member %d (%s) still cannot serve (it tries again later): %s", m.id, m.name, m.error)
        m.said_still = True
    else:
        log.warning("member %d (%s) cannot serve: %s; left out of the ring", m.id, m.name, m.error or m.state)
