"""The ring's host (`sfchat host`): admits members, plans layer spans, and runs one forward pass around the ring.

The host holds the embeddings, the first span, the final norm and the LM head, so logits never cross the
network. A pass goes host -> member 1 -> ... -> member n -> host over trio TCP streams.
"""
from __future__ import annotations

import itertools
import logging
import math
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import trio

from . import hub, links, models, tensors, validate, wire
from .auth import AuthError, new_token, server_handshake
from .channel import Channel, ChannelClosed, parse_addr, peername
from .errors import RingError
from .tls import Endpoint as TLSEndpoint
from .fingerprint import config_fingerprint
from .memory import default_device, free_bytes, pick_dtype, rss_bytes
from .plan import split_layers
from .shard import DTYPES, SessionCache, Shard, Span, load_config
from .threads import call_with_threads

log = logging.getLogger("sfchat.host")


@dataclass
class Member:
    id: int
    name: str
    ctl: Channel
    data_addr: str
    device: str
    free_bytes: int
    dtype: str
    state: str = "joining"  # joining, loading, ready, idle (no layers), failed, lost
    span: Span | None = None
    rtt_ms: float = math.nan
    rss: int = 0
    tls_fingerprint: str = ""
    download: dict | None = None  # while it fetches its layers' files: {"file", "done", "total"} in bytes
    rss_before: int = 0  # before it loaded anything: rss - rss_before is what its span costs
    last_seen: float = field(default_factory=time.monotonic)
    ready: trio.Event = field(default_factory=trio.Event)
    error: str = ""

    def info(self) -> dict:
        return {"id": self.id, "name": self.name, "address": self.data_addr, "device": self.device,
                "layers": str(self.span) if self.span else "", "dtype": self.dtype,
                "state": downloading(self.download) or self.state, "download": self.download,
                "rtt_ms": None if math.isnan(self.rtt_ms) else round(self.rtt_ms, 2),
                "memory_bytes": self.rss, "free_bytes": self.free_bytes}


def downloading(d: dict | None) -> str:
    """The state column while a member fetches: the share of its files' bytes it has."""
    return f"↓ {100 * d['done'] / d['total']:.0f}%" if d and d.get("total") else ""


@dataclass
class RingSession:
    """A conversation as the ring sees it: the host's own cache and how many positions the ring holds."""

    sid: str
    cache: SessionCache | None = None
    ring_len: int = 0  # positions every stage's cache holds (valid for `epoch`)
    epoch: int = -1
    features: tuple[int, list[int], torch.Tensor] | None = None  # last pass: first position, ids, final features


class Host:
    def __init__(self, model: str | None = None, *, token: str | None = None, listen: str = "127.0.0.1:0",
                 device: str | None = None, dtype: str = "auto", quant: str = "none",
                 offer_gb: float | None = None, heartbeat_s: float = 1.0, dead_after_s: float = 4.0,
                 say=print, on_change=None, tls: bool = False,
                 relay: str | None = None):
        self.model_spec = model or models.DEFAULT_MODEL
        self.token = token or new_token()
        self.listen = listen
        self.relay, self.relay_address = relay, ""  # relay://… once registered
        self.tls = TLSEndpoint(tls, "host")
        self.device = device or default_device()
        self.dtype, self.quant, self.offer_gb = pick_dtype(dtype, self.device), quant, offer_gb
        self.heartbeat_s, self.dead_after_s = heartbeat_s, dead_after_s
        self.say = say
        self.on_change = on_change or (lambda: None)
        self.bars = on_change is None  # download bars on the terminal, unless a screen shows the ring
        self.source = models.open_source(self.model_spec, say=say)  # a hub model: only config and tokenizer yet
        self.model_dir: Path = self.source.dir
        self.download = hub.Progress()  # the host's own fetch, for its row in the ring panel
        self.plan_at_start = True  # False: members are on their way; plan (and fetch) once they are here
        self.config = load_config(self.model_dir)
        self.fingerprint = config_fingerprint(self.model_dir)
        self.members: list[Member] = []
        self.ring: list[Member] = []  # members with layers, in pass order
        self.shard: Shard | None = None
        self.epoch = 0
        self.port = 0
        self.first_hop: Channel | None = None
        self.waiting: dict[tuple[str, int], trio.MemorySendChannel] = {}
        self.seq = itertools.count()
        self.compute = trio.CapacityLimiter(1)
        self.threads = torch.get_num_threads()  # for the shard's compute, whatever a draft's thread has set
        self.plan_lock = trio.Lock()
        self.member_ids = itertools.count(1)
        self.joined = trio.Condition()
        self.pending_epoch = 0
        self.auto_replan = False  # `sfchat host`: re-plan as members join

    # --- serving -------------------------------------------------------------------------------------------

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            got = await nursery.start(links.serve, self._accept, self.listen, self.relay, links.host_endpoint())
            self.port, self.relay_address = got.port, got.relay_address
            self.nursery = nursery
            if self.plan_at_start:
                await self.replan()  # the host alone, until members join
            nursery.start_soon(self._heartbeat)
            task_status.started(self.port)

    @property
    def address(self) -> str:
        """Where others reach the host; a wildcard listen address is shown as this machine's own."""
        host = parse_addr(self.listen)[0]
        if host in ("0.0.0.0", "::", ""):
            try:
                host = socket.gethostbyname(socket.gethostname())
            except OSError:
                host = "127.0.0.1"
        return f"{host}:{self.port}"

    def invite(self) -> str:
        tls = f" --tls {self.tls.fingerprint}" if self.tls.enabled else ""
        return f"sfchat join {self.relay_address or self.address} --token {self.token}{tls}"

    async def _accept(self, stream: trio.SocketStream) -> None:
        try:
            stream = await self.tls.accept(stream)
        except (OSError, trio.BrokenResourceError, trio.TooSlowError) as e:
            log.warning("TLS handshake with %s failed: %s", peername(stream), e)
            return
        ch = Channel(stream, "incoming", read_timeout=3600)
        try:
            hello = await server_handshake(ch, self.token, {"member": 0})
            if hello["role"] == "join":
                await self._member(ch, hello, stream)
            elif hello["role"] == "data":
                await self._returns(ch)
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

    async def _member(self, ch: Channel, hello: dict, stream) -> None:
        offer = await ch.recv(timeout=10)
        if offer["t"] != "offer":
            raise wire.WireError("expected an offer after the handshake")
        ip = peername(stream).rpartition(":")[0]
        port = validate.need(offer, "data_port", int, 1)
        addr = offer.get("advertise") or f"{ip}:{port}"
        m = Member(next(self.member_ids), str(hello.get("name", "peer"))[:40], ch, addr,
                   str(offer.get("device", "?"))[:20], validate.need(offer, "free_bytes", int, 0),
                   str(offer.get("dtype", "float32")))
        m.rss_before = int(offer.get("rss_bytes") or 0)
        m.tls_fingerprint = str(offer.get("tls_fingerprint") or "")
        if self.tls.enabled and not m.tls_fingerprint:
            raise wire.WireError("this ring uses TLS: the member must have a certificate too")
        ch.name = f"member {m.id}"
        self.members.append(m)
        log.info("member %d (%s) joined from %s offering %.1f GB on %s", m.id, m.name, addr, m.free_bytes / 2**30, m.device)
        self.on_change()
        async with self.joined:
            self.joined.notify_all()
        if self.auto_replan:
            self.nursery.start_soon(self._replan_logged)
        try:
            while True:
                msg = await ch.recv()
                m.last_seen = time.monotonic()
                if msg["t"] == "pong" and isinstance(msg.get("n"), float):
                    m.rtt_ms = (time.perf_counter() - msg["n"]) * 1e3
                elif msg["t"] == "ready" and msg.get("epoch") == self.pending_epoch:
                    m.state, m.rss, m.download = "ready", int(msg.get("rss_bytes") or 0), None
                    m.ready.set()
                elif msg["t"] == "progress":
                    m.download = validate.progress(msg)
                elif msg["t"] == "fail":
                    m.state, m.error, m.download = "failed", str(msg.get("error")), None
                    log.error("member %d cannot serve: %s", m.id, m.error)
                    m.ready.set()
                elif msg["t"] == "error":
                    raise ChannelClosed(str(msg.get("error")))
                self.on_change()
        finally:
            m.state = "lost"
            m.ready.set()
            log.warning("member %d (%s) is gone", m.id, m.name)
            self.on_change()

    async def _returns(self, ch: Channel) -> None:
        """The last hop's results come back here; hand each to the pass waiting for it."""
        while True:
            msg = await ch.recv()
            if msg["t"] not in ("fwd", "fail"):
                raise wire.WireError(f"unexpected {msg['t']!r} on the return link")
            waiter = self.waiting.get((msg.get("sid"), msg.get("seq")))
            if waiter is not None:
                waiter.send_nowait(msg)

    async def _heartbeat(self) -> None:
        """Ping every member; one silent for dead_after_s (killed, stopped, cut off) is declared lost."""
        while True:
            now = time.monotonic()
            for m in list(self.members):
                if m.state == "lost":
                    continue
                if now - m.last_seen > self.dead_after_s:
                    await self.lose(m, f"no heartbeat for {now - m.last_seen:.1f} s")
                    continue
                try:
                    await m.ctl.send({"t": "ping", "n": time.perf_counter()})
                except ChannelClosed:
                    await self.lose(m, "its control link broke")
            await trio.sleep(self.heartbeat_s)

    async def lose(self, m: Member, why: str) -> None:
        if m.state == "lost":
            return
        m.state, m.error = "lost", why
        m.ready.set()
        log.warning("member %d (%s) lost: %s", m.id, m.name, why)
        self.on_change()
        await m.ctl.aclose()

    # --- planning ------------------------------------------------------------------------------------------

    async def wait_members(self, n: int, timeout: float = 120) -> None:
        with trio.fail_after(timeout):
            async with self.joined:
                while sum(m.state != "lost" for m in self.members) < n:
                    await self.joined.wait()

    def host_offer(self) -> float:
        if self.offer_gb is not None:
            return self.offer_gb * 2**30
        # the embedding and head stay here whatever the plan, so they come off the host's budget
        c = self.config
        fixed = 2 * c.vocab_size * c.hidden_size * DTYPES[self.dtype].itemsize
        return max(free_bytes(self.device) - fixed, 0)

    async def replan(self) -> None:
        """Split the layers over the host and every live member, load, and wire the ring."""
        async with self.plan_lock:
            live = [m for m in self.members if m.state not in ("lost", "failed")]
            spans = split_layers(self.config.num_hidden_layers, [self.host_offer()] + [m.free_bytes for m in live])
            await self._fetch_own(spans[0])  # before anything changes: a failed fetch leaves the ring as it was
            self.pending_epoch = epoch = self.epoch + 1
            ring = [m for m, s in zip(live, spans[1:]) if s.size]
            for m, s in zip(live, spans[1:]):
                m.span, m.state, m.ready = s, ("loading" if s.size else "idle"), trio.Event()
            self.on_change()
            if self.shard is None or self.shard.span != spans[0]:
                self.shard = None
                self.shard = await trio.to_thread.run_sync(
                    lambda: Shard(self.model_dir, spans[0], embed=True, head=True, dtype=self.dtype,
                                  quant=self.quant, device=self.device))
            for i, m in enumerate(ring):
                nxt = ring[i + 1].data_addr if i + 1 < len(ring) else "@host"
                pin = ring[i + 1].tls_fingerprint if i + 1 < len(ring) else self.tls.fingerprint
                try:
                    await m.ctl.send({"t": "assign", "epoch": epoch, "model": self.source.spec,
                                      "config_fingerprint": self.fingerprint,
                                      "span_fingerprint": await trio.to_thread.run_sync(
                                          self.source.identity, m.span.start, m.span.end),
                                      "start": m.span.start,
                                      "end": m.span.end, "n_layers": m.span.n_layers, "next": nxt, "next_tls": pin,
                                      "host_port": self.port})
                except ChannelClosed:
                    m.state = "lost"
            for m in ring:
                with trio.move_on_after(600):
                    await m.ready.wait()
            bad = [m for m in ring if m.state != "ready"]
            if bad:
                for m in bad:
                    if m.state != "lost":
                        m.state = "failed"
                raise RingError("; ".join(f"member {m.id}: {m.error or m.state}" for m in bad))
            if self.first_hop is not None:
                await self.first_hop.aclose()
                self.first_hop = None
            if ring:
                stream = await TLSEndpoint.dial(await links.dial(ring[0].data_addr), ring[0].tls_fingerprint)
                self.first_hop = Channel(stream, "first hop")
                from .auth import client_handshake
                await client_handshake(self.first_hop, self.token, "data")
            self.ring, self.epoch = ring, epoch
            log.info("ring epoch %d: host %s%s", epoch, spans[0],
                     "".join(f" -> member {m.id} {m.span}" for m in ring))
            self.on_change()

    async def _fetch_own(self, span: Span) -> None:
        """The files of the host's span, embedding, norm and head (a hub model's: fetched if missing)."""
        try:
            await trio.to_thread.run_sync(lambda: self.source.fetch(
                span.start, span.end, embed=True, head=True, progress=self.download, bars=self.bars))
        except models.ModelError as e:
            raise RingError(str(e)) from None
        finally:
            self.on_change()

    async def _replan_logged(self) -> None:
        try:
            await self.replan()
        except RingError as e:
            log.error("re-plan failed: %s", e)

    def members_info(self) -> list[dict]:
        d = self.download
        fetching = {"file": d.file, "done": d.done + d.current, "total": d.total} if d.active else None
        host = {"id": 0, "name": "host", "address": self.address, "device": self.device, "dtype": self.dtype,
                "layers": str(self.shard.span) if self.shard else "", "state": downloading(fetching) or "ready",
                "download": fetching, "rtt_ms": 0.0,
                "memory_bytes": rss_bytes(), "free_bytes": int(self.host_offer())}
        return [host] + [m.info() for m in self.members]

    # --- one pass ------------------------------------------------------------------------------------------

    def new_session(self, sid: str) -> RingSession:
        return RingSession(sid)

    def committed(self, s: RingSession) -> int:
        """How many of the session's positions every stage still holds; 0 after a re-plan (replay)."""
        return s.ring_len if s.epoch == self.epoch and s.cache is not None else 0

    async def recover(self, attempts: int = 5) -> None:
        """After a failed pass: re-plan over the members still alive (the host takes what is left, as memory
        allows); each session then replays its committed tokens in one prefill on its next pass."""
        for i in range(attempts):
            await trio.sleep(0.2 * (i + 1))
            try:
                return await self.replan()
            except RingError as e:  # a member failed while loading: it is excluded from the next plan
                log.warning("re-plan failed: %s", e)
        raise RingError(f"could not re-form the ring after {attempts} attempts")

    async def forward(self, s: RingSession, tokens: list[int], drafts: list[int],
                      sent: trio.Event | None = None, parents: list[int] | None = None) -> tuple[torch.Tensor, dict]:
        """One pass: the tokens the ring lacks plus the drafts; logits at the last token and each draft.

        The frame carries `committed`, the positions every stage keeps; each stage first trims its cache to it
        (the rollback rule), so a failed or repeated pass is harmless. `parents`: the drafts form a tree
        (peers/tree.py), not a chain. Returns (logits [K+1, vocab], timing)."""
        async with self.plan_lock:  # no re-plan in the middle of a pass
            return await self._forward(s, tokens, drafts, sent, parents)

    async def _forward(self, s: RingSession, tokens: list[int], drafts: list[int],
                       sent: trio.Event | None, parents: list[int] | None) -> tuple[torch.Tensor, dict]:
        committed = self.committed(s)
        if committed == 0:
            s.cache, s.epoch = self.shard.new_session(), self.epoch
        ids, n_logits = tokens[committed:] + drafts, len(drafts) + 1
        t0 = time.perf_counter()
        x = torch.tensor([ids], dtype=torch.long)
        h = await trio.to_thread.run_sync(call_with_threads, self.threads, self.shard.forward, s.cache, committed,
                                           x, parents, limiter=self.compute)
        host_ms = (time.perf_counter() - t0) * 1e3
        trace: list = []
        if self.ring:
            seq = next(self.seq)
            send, recv = trio.open_memory_channel(1)
            self.waiting[(s.sid, seq)] = send
            try:
                await self.first_hop.send({"t": "fwd", "epoch": self.epoch, "sid": s.sid, "seq": seq,
                                           "committed": committed, "n_logits": n_logits,
                                           "x": tensors.pack_tensor(h[:, :, :]), "trace": [],
                                           **({"parents": parents} if parents is not None else {})})
                if sent is not None:
                    sent.set()  # the host's part is done: the round is on the wire
                reply = await self._await_reply(recv, self.pass_timeout(len(ids)))
            except (ChannelClosed, trio.TooSlowError) as e:
                s.epoch = -1  # caches unknown: replay from scratch next time
                raise RingError(f"the ring did not answer: {e}") from None
            finally:
                del self.waiting[(s.sid, seq)]
            if reply["t"] == "fail":
                s.epoch = -1
                raise RingError(str(reply.get("error")))
            try:
                h = validate.forward_frame(reply, self.config.hidden_size)
            except wire.WireError as e:
                raise RingError(f"the last member returned a bad frame: {e}") from None
            trace = reply["trace"]
        t1 = time.perf_counter()
        feats, logits = await trio.to_thread.run_sync(call_with_threads, self.threads, self.shard.finish, h[0],
                                                      n_logits, limiter=self.compute)
        s.features = (committed, ids, feats)  # what a feature draft reads next
        head_ms = (time.perf_counter() - t1) * 1e3
        s.ring_len = committed + len(ids)
        total_ms = (time.perf_counter() - t0) * 1e3
        peers_ms = sum(ms for _, ms in trace)
        return logits, {"host_ms": host_ms + head_ms, "peers": trace, "peers_ms": peers_ms,
                           "network_ms": max(total_ms - host_ms - head_ms - peers_ms, 0.0), "pass_ms": total_ms}

    async def _await_reply(self, recv: trio.MemoryReceiveChannel, timeout: float) -> dict:
        """The pass's result, or RingError as soon as a ring member is declared lost."""
        deadline = trio.current_time() + timeout
        while trio.current_time() < deadline:
            with trio.move_on_after(0.1):
                return await recv.receive()
            lost = [m for m in self.ring if m.state == "lost"]
            if lost:
                raise RingError(f"member {lost[0].id} ({lost[0].name}) was lost: {lost[0].error}")
        raise trio.TooSlowError

    def pass_timeout(self, n_tokens: int) -> float:
        return 60.0 + n_tokens * 0.5

    async def drop(self, s: RingSession) -> None:
        for m in self.ring:
            try:
                await m.ctl.send({"t": "drop", "sid": s.sid})
            except ChannelClosed:
                pass

    async def close(self) -> None:
        for m in self.members:
            try:
                with trio.move_on_after(1):
                    await m.ctl.send({"t": "bye"})
            except ChannelClosed:
                pass
