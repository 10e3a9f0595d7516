"""Who is in the ring: members admitted over their control link, pinged every heartbeat, lost when silent.

This plane knows a member's offer, its state and the span it was last given; which layers it gets is
planning's business (peers/plan/planner.py), and what flows through it is the pass's (peers/host/host.py).
"""
from __future__ import annotations

import itertools
import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field
from functools import partial

import trio

from peers.wire import schema as validate, codec as wire
from peers.links.channel import Channel, ChannelClosed, peername
from peers.links.control import ControlLink
from peers.base.span import Span
from peers.base.stalls import STALLS

log = logging.getLogger("sfchat.host")
CHECK_S = 0.1  # how often the heartbeat looks for a member silent past its limit
SUSPECT = 0.5  # silent for this share of its limit: likely lost, and the others prepare (peers/compute/spares.py)



def downloading(d: dict | None) -> str:
    """The state column while a member fetches its files: the share of their bytes it has."""
    return f"↓ {100 * d['done'] / d['total']:.0f}%" if d and d.get("total") else ""

@dataclass
class Member:
    id: int
    name: str
    ctl: Channel
    data_addr: str
    device: str
    free_bytes: int
    dtype: str
    quant: str = "none"
    state: str = "joining"  # joining, loading, ready, spare (no layers: placed out by speed), failed, lost
    span: Span | None = None
    epoch: int = -1  # the plan it was last given: its "ready" counts for that plan only
    rtt_ms: float = math.nan
    ms_per_layer: float = math.nan  # its measured speed on the reference layer (peers/compute/speed.py)
    share: float = 0.0  # its part of the predicted time per token under the current plan
    rss: int = 0  # memory in use (resident set on a CPU, allocated tensors on a GPU), as last reported
    peak: int = 0  # the most it has used
    tls_fingerprint: str = ""
    compute: str = ""  # what computes its layers (peers/compute/device.py: compute_id); shared with others on one device
    sessions: int = 0  # conversations whose caches it holds (as of its last pong)
    frames: int = 0  # passes it has computed (as of its last pong)
    graphs: int = 0  # CUDA graphs it has captured for its span (as of its last pong)
    planned_bytes: int = 0  # what the plan counts for its span
    download: dict | None = None  # while it fetches its layers' files: {"file", "done", "total"} in bytes
    rss_before: int = 0  # before it loaded its span: rss - rss_before is what the span costs
    last_seen: float = field(default_factory=time.monotonic)
    suspected: bool = False  # silent for SUSPECT of its limit since it was last heard (the others warm up)
    answered: float = -math.inf  # when the host sent the latest ping it answered: it ran after that (monotonic)
    rtts: deque = field(default_factory=lambda: deque(maxlen=100))  # its last pongs' round trips, in seconds
    computing: int | None = None  # the seq of the frame it computes, as of its last pong (a long pass: progress)
    ready: trio.Event = field(default_factory=trio.Event)
    error: str = ""
    oom: bool = False  # it failed by running out of memory (error says how)
    leaving: bool = False  # it cannot serve as it is and leaves once the host hangs up (sfchat join exits)
    left: bool = False  # it said bye: stopped by its user
    key: str = ""  # the same for every join of one `sfchat join` (--stay's retries): it keeps its number
    failed_before: str = ""  # why it could not serve at its join before, under the same number
    said_still: bool = False  # "still cannot serve" has been said once

    def info(self) -> dict:
        return {"id": self.id, "name": self.name, "address": self.data_addr, "device": self.device,
                "layers": str(self.span) if self.span and self.state not in ("lost", "failed") else "",
                "dtype": self.dtype, "quant": self.quant,
                "state": downloading(self.download) or ("left" if self.left else self.state),
                "download": self.download,
                "rtt_ms": None if math.isnan(self.rtt_ms) else round(self.rtt_ms, 2),
                "memory_bytes": self.rss, "peak_memory_bytes": self.peak, "free_bytes": self.free_bytes,
                "span_memory_bytes": max(self.rss - self.rss_before, 0) if self.rss_before else None,
                "conversations": self.sessions, "graphs": self.graphs, "planned_bytes": self.planned_bytes,
                "ms_per_layer": None if math.isnan(self.ms_per_layer) else round(self.ms_per_layer, 3),
                "share": round(self.share, 3), "spare": self.state == "spare"}

    def silent_limit(self, dead_after_s: float) -> float:
        """How long it may be silent before it is lost: dead_after_s, never under 5x its p99 pong (a member on a
        slow or loaded link is slow, not dead)."""
        if len(self.rtts) < 5:
            return dead_after_s
        p99 = sorted(self.rtts)[min(len(self.rtts) - 1, int(0.99 * len(self.rtts)))]
        return max(dead_after_s, 5 * p99)

    def reported(self, msg: dict) -> None:
        """Take the memory figures a pong or ready carries."""
        self.rss = int(msg.get("memory_bytes") or self.rss)
        self.peak = int(msg.get("peak_memory_bytes") or self.peak)
        self.rss_before = int(msg.get("base_bytes") or self.rss_before)

    def assign(self, span: Span, epoch: int) -> None:
        """Planned in: loading its span for `epoch` (idle if it holds no layers), ready once it says so."""
        self.span, self.epoch, self.ready = span, epoch, trio.Event()
        self.state = "loading" if span.size else "spare"


class Roster:
    """The members, their control links and heartbeats. `on_join` runs after each admission, `on_lost(member)`
    when a member is lost."""

    def __init__(self, *, tls: bool, heartbeat_s: float, dead_after_s: float, on_change, on_join,
                 on_lost=lambda m: None, on_link=lambda epoch, why, m, hop: None,
                 on_quiet=lambda epoch, m, seconds: None, on_suspect=lambda m: None):
        self.tls, self.heartbeat_s, self.dead_after_s = tls, heartbeat_s, dead_after_s
        self.on_change, self.on_join, self.on_lost = on_change, on_join, on_lost
        self.on_link = on_link  # (epoch, why, member, hop): a member says its link of that plan broke
        self.on_quiet = on_quiet  # (epoch, member, seconds): a member says its link of that plan went silent
        self.on_suspect = on_suspect  # (member): silent for SUSPECT of its limit, likely lost soon
        self.members: list[Member] = []
        self.ids = itertools.count(1)
        self.joined = trio.Condition()
        self.closing = False  # the host is ending the ring

    def live(self) -> list[Member]:
        return [m for m in self.members if m.state not in ("lost", "failed")]

    async def wait(self, n: int, timeout: float = 120) -> None:
        """Until n members that are not lost have joined."""
        with trio.fail_after(timeout):
            async with self.joined:
                while sum(m.state != "lost" for m in self.members) < n:
                    await self.joined.wait()

    async def admit(self, ch: Channel, hello: dict, stream) -> None:
        """A joiner after its handshake: take its offer, then follow its control link until it ends."""
        link = ControlLink(ch, "host")
        offer = await link.recv(timeout=10)
        ch.read_timeout = None  # from here the heartbeat says when a member is silent
        ip = peername(stream).rpartition(":")[0]
        port = validate.need(offer, "data_port", int, 1)
        addr = offer.get("advertise") or f"{ip}:{port}"
        key = str(offer.get("key") or "")[:64]
        # a joiner trying again (--stay) keeps its number, and what it failed with last time
        before = next((m for m in self.members if key and m.key == key and m.state in ("lost", "failed")), None)
        if before is not None:
            self.members.remove(before)
        m = Member(before.id if before else next(self.ids), str(hello.get("name", "peer"))[:40], ch, addr,
                   str(offer.get("device", "?"))[:20], validate.need(offer, "free_bytes", int, 0),
                   str(offer.get("dtype", "float32")), str(offer.get("quant", "none")), key=key)
        if before is not None:
            m.failed_before, m.said_still = before.error if before.leaving else "", before.said_still
        m.rss_before = int(offer.get("rss_bytes") or 0)
        m.ms_per_layer = validate.speed(offer)
        m.tls_fingerprint = str(offer.get("tls_fingerprint") or "")
        m.compute = str(offer.get("compute") or f"member {m.id}")[:80]
        if self.tls and not m.tls_fingerprint:
            raise wire.WireError("this ring uses TLS: the member must have a certificate too")
        ch.name = f"member {m.id}"
        self.members.append(m)
        log.info("member %d (%s) joined from %s offering %.1f GB on %s", m.id, m.name, addr, m.free_bytes / 2**30,
                 m.device)
        self.on_change()
        async with self.joined:
            self.joined.notify_all()
        self.on_join()
        try:
            await ch.send({"t": "ping", "n": time.perf_counter()})  # its round trip, for the plan that comes next
            await link.follow({t: partial(self._heard, m, handle)
                               for t, handle in (("pong", _pong), ("ready", _ready), ("progress", _progress),
                                                 ("fail", _fail), ("bye", _bye), ("link", self._link),
                                                 ("quiet", self._quiet))})
        except ChannelClosed as e:  # the reason a pass waiting on this member reports
            m.error = m.error or str(e).removeprefix(f"{ch.name}: ") or "its connection closed"
            raise
        finally:
            if m.state != "lost":
                m.state, m.error = "lost", m.error or "its connection closed"
                m.ready.set()
                # the host ending the ring closes every member, one that cannot serve leaves (that was said), and
                # one stopped by its user says bye: no loss to warn about
                if m.left:
                    log.info("member %d (%s) left%s", m.id, m.name, "; re-planning" if m.span and m.span.size else "")
                else:
                    log.log(logging.DEBUG if self.closing or m.leaving else logging.WARNING, "member %d (%s) %s: %s",
                            m.id, m.name, "left" if m.leaving else "lost", m.error)
                self.on_change()
                self.on_lost(m)

    async def _heard(self, m: Member, handle, msg: dict) -> None:
        m.last_seen, m.suspected = time.monotonic(), False
        handle(m, msg)
        self.on_change()
        if m.leaving:  # it waits for the host to hang up, so its failure is read before its link closes
            await m.ctl.aclose()

    def _link(self, m: Member, msg: dict) -> None:
        if isinstance(msg.get("epoch"), int):
            hop = str(msg.get("hop"))[:20]
            self.on_link(msg["epoch"], f"member {m.id} ({m.name}): its {hop} link broke: "
                                       f"{str(msg.get('error'))[:300]}", m, hop)

    def _quiet(self, m: Member, msg: dict) -> None:
        epoch, seconds = msg.get("epoch"), msg.get("s")
        if isinstance(epoch, int) and isinstance(seconds, (int, float)) and msg.get("hop") == "prev hop":
            self.on_quiet(epoch, m, float(seconds))

    async def heartbeat(self) -> None:
        """Ping every member; one silent for dead_after_s (killed, stopped, cut off) is declared lost.

        A host held up itself (a model loading on its event loop, a long pause of the process) has not read what its
        members sent meanwhile: their silence over that time is the host's, and each gets a fresh window."""
        last = next_ping = time.monotonic()
        tick = min(self.heartbeat_s, CHECK_S)  # silence is checked more often than pings go: lost on time
        while True:
            now = time.monotonic()
            if now - last > 2 * self.heartbeat_s or STALLS.within(self.dead_after_s, now):  # the host's own stall
                for m in self.members:
                    m.last_seen = max(m.last_seen, now - self.heartbeat_s)
            last = now
            ping = now >= next_ping
            if ping:
                next_ping = now + self.heartbeat_s
            for m in list(self.members):
                if m.state == "lost":
                    continue
                if now - m.last_seen > m.silent_limit(self.dead_after_s):
                    await self.lose(m, f"no heartbeat for {now - m.last_seen:.1f} s")
                    continue
                if now - m.last_seen > SUSPECT * m.silent_limit(self.dead_after_s) and not m.suspected:
                    m.suspected = True
                    self.on_suspect(m)
                try:
                    if ping:
                        await m.ctl.send({"t": "ping", "n": time.perf_counter()})
                except ChannelClosed:
                    await self.lose(m, "its control link broke")
            await trio.sleep(tick)

    def out_of_memory(self, member_id: object, error: str) -> None:
        """A member ran out of memory in a pass (its failure came round the ring): planned out from now on."""
        for m in self.members:
            if m.id == member_id and m.state not in ("lost", "failed"):
                m.state, m.error, m.oom = "failed", error, True
                m.ready.set()
                log.error("%s", error)
                self.on_change()

    async def lose(self, m: Member, why: str) -> None:
        if m.state == "lost":
            return
        m.state, m.error = "lost", why
        m.ready.set()
        log.warning("member %d (%s) lost: %s", m.id, m.name, why)
        self.on_change()
        self.on_lost(m)
        await m.ctl.aclose()

    async def tell(self, members: list[Member], msg: dict, timeout: float = math.inf) -> None:
        """Send a control message to each of `members`; one whose link is gone is skipped."""
        for m in members:
            try:
                with trio.move_on_after(timeout):
                    await m.ctl.send(msg)
            except ChannelClosed:
                pass


def _pong(m: Member, msg: dict) -> None:
    if isinstance(msg.get("n"), float):  # our own perf_counter from the ping
        m.rtt_ms = (time.perf_counter() - msg["n"]) * 1e3
        m.rtts.append(m.rtt_ms / 1e3)
        m.answered = max(m.answered, time.monotonic() - m.rtt_ms / 1e3)
        m.computing = msg.get("computing") if isinstance(msg.get("computing"), int) else None
        m.sessions = int(msg.get("sessions") or 0)
        m.frames = int(msg.get("frames") or 0)
        m.graphs = int(msg.get("graphs") or 0)
        m.reported(msg)


def _ready(m: Member, msg: dict) -> None:
    if msg.get("epoch") == m.epoch:  # not a late answer to an older plan
        m.state, m.download = "ready", None
        m.reported(msg)
        m.ready.set()


def _progress(m: Member, msg: dict) -> None:
    m.download = validate.progress(msg)


def _fail(m: Member, msg: dict) -> None:
    m.state, m.error, m.oom = "failed", str(msg.get("error")), bool(msg.get("oom"))
    m.leaving = bool(msg.get("leaving"))
    m.download = None
    log.debug("member %d cannot serve: %s", m.id, m.error)  # the plan that waits for it says so, once
    m.ready.set()


def _bye(m: Member, msg: dict) -> None:
    m.left, m.error = True, "it left"
