"""The ring's host (`sfchat host`): the forward pass around the ring, over the members and plan it keeps.

The host holds the embeddings, the first span, the final norm and the LM head, so logits never cross the
network. A pass goes host -> member 1 -> ... -> member n -> host over trio TCP streams. Who is in the ring is
peers/membership.py, which layers each holds is peers/planning.py, and the rollback rule peers/ring_session.py.
"""
from __future__ import annotations

import itertools
import logging
import time
import weakref

import torch
import trio

from . import checkpoint, device, links, models, tensors, validate, wire
from .batcher import Batcher, Round
from .auth import AuthError, new_token, server_handshake
from .channel import Channel, ChannelClosed, parse_addr, peername
from .errors import FitError, MemberLeft, RingError
from .fingerprint import config_fingerprint
from .memory import default_device, pick_dtype, reset_peak, usage
from .membership import Member, Roster, downloading
from .options import HostOptions
from .plan import ModelSize, chunk_end, chunk_positions
from .planning import Planner, Target
from .ring_session import RingSession
from .shard import load_config
from .tensors import DTYPES
from .threads import call_with_threads
from .tls import Endpoint as TLSEndpoint
from .turns import SHARED_CHUNK, Turns

log = logging.getLogger("sfchat.host")

__all__ = ["Host", "Member", "RingError", "RingSession"]


class Host:
    def __init__(self, opts: HostOptions = HostOptions(), *, say=print, on_change=None):
        self.model_spec = opts.model or models.DEFAULT_MODEL
        self.token = opts.token or new_token()
        self.listen = opts.listen
        self.relay, self.relay_address = opts.relay, ""  # relay://… once registered
        self.tls = TLSEndpoint(opts.tls, "host")
        self.device = opts.device or default_device()
        self.dtype, self.quant = pick_dtype(opts.dtype, self.device), opts.quant
        reset_peak(self.device)
        self.say = say
        self.on_change = on_change or (lambda: None)
        self.source = models.open_source(self.model_spec, say=say)  # a hub model: only config and tokenizer yet
        self.model_dir = self.source.dir
        self.plan_at_start = True  # False: members are on their way; plan (and fetch) once they are here
        self.config = load_config(self.model_dir)
        self.fingerprint = config_fingerprint(self.model_dir)
        self.roster = Roster(tls=self.tls.enabled, heartbeat_s=opts.heartbeat_s, dead_after_s=opts.dead_after_s,
                             on_change=lambda: self.on_change(), on_join=self._joined, on_lost=self._lost)
        size = ModelSize.of(checkpoint.read_config(self.model_dir), self.source.tensor_shapes())
        target = Target(self.source.spec, self.model_dir, self.source, self.config, self.fingerprint, self.dtype,
                        self.quant, self.device, size, opts.max_context or size.default_context(), opts.graphs)
        self.planner = Planner(target, self.roster, offer_gb=opts.offer_gb, token=self.token, tls=self.tls,
                               on_change=self._plan_changed)
        self.planner.bars = on_change is None  # download bars on the terminal, unless a screen shows the ring
        self.port = 0
        # (sid, seq) -> where its reply goes, and the tensor its hidden states land in (None: one of their own)
        self.waiting: dict[tuple[str, int], tuple[trio.MemorySendChannel, torch.Tensor | None]] = {}
        self.seq = itertools.count()
        self.compute = trio.CapacityLimiter(1)
        self.turns = Turns()  # a long pass takes turns with other conversations' passes
        self.threads = torch.get_num_threads()  # for the shard's compute, whatever a draft's thread has set
        self.auto_replan = False  # `sfchat host`: re-plan as members join
        self.batcher = Batcher(self._run_batch, in_flight=self.devices)  # conversations' rounds go round together
        # the conversations, while they live (by id: a RingSession, a dataclass, is not hashable)
        self.sessions: weakref.WeakValueDictionary[int, RingSession] = weakref.WeakValueDictionary()

    # the two planes the pass reads: who is in the ring, and the current plan
    members = property(lambda self: self.roster.members)
    ring = property(lambda self: self.planner.ring)
    epoch = property(lambda self: self.planner.epoch)
    shard = property(lambda self: self.planner.shard)
    first_hop = property(lambda self: self.planner.first_hop)
    max_context = property(lambda self: self.planner.target.max_context)  # what the plan made room for

    async def wait_members(self, n: int, timeout: float = 120) -> None:
        await self.roster.wait(n, timeout)

    async def replan(self) -> None:
        await self.planner.replan(self.port)

    async def recover(self, failed_epoch: int) -> None:
        await self.planner.recover(self.port, failed_epoch)

    def _joined(self) -> None:
        if self.auto_replan:
            self.nursery.start_soon(self.planner.replan_logged, self.port)

    def _lost(self, m: Member) -> None:
        """A member of the ring is gone: re-plan over the rest now, not at the next pass (unless a pass's own
        recovery has done it by then)."""
        if self.auto_replan and not self.roster.closing and m in self.ring:
            self.nursery.start_soon(self.planner.replan_logged, self.port, self.epoch)

    def members_info(self) -> list[dict]:
        now, peak = usage(self.device)
        fetching = self.planner.fetching()
        problem = "" if self.planner.gate.replanning else self.planner.problem()
        host = {"id": 0, "name": "host", "address": self.address, "device": self.device, "dtype": self.dtype,
                "layers": str(self.shard.span) if self.shard else "",
                "state": downloading(fetching) or ("waiting" if problem else "ready"), "error": problem,
                "download": fetching, "rtt_ms": 0.0,
                "memory_bytes": now, "peak_memory_bytes": peak, "free_bytes": int(self.planner.host_offer())}
        return [host] + [m.info() for m in self.members]

    # --- serving -------------------------------------------------------------------------------------------

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            got = await nursery.start(links.serve, self._accept, self.listen, self.relay, links.host_endpoint())
            self.port, self.relay_address = got.port, got.relay_address
            self.nursery = nursery
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
        ch = Channel(stream, "incoming", read_timeout=3600)
        try:
            hello = await server_handshake(ch, self.token, {"member": 0})
            if hello["role"] == "join":
                await self.roster.admit(ch, hello, stream)
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

    async def _returns(self, ch: Channel) -> None:
        """The last hop's results come back here; hand each to the pass waiting for it."""
        while True:
            msg = await ch.recv(into=self._landing)
            if msg["t"] not in ("fwd", "fail"):
                raise wire.WireError(f"unexpected {msg['t']!r} on the return link")
            waiter = self.waiting.get((msg.get("sid"), msg.get("seq")))
            if waiter is not None:
                waiter[0].send_nowait(msg)

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
        (peers/tree.py), not a chain. Returns (logits [K+1, vocab], timing)."""
        if self._one_frame(s, tokens, drafts):  # a round: it goes round with the other conversations' rounds
            return await self.batcher.submit(Round(s, tokens, drafts, parents, sent))
        async with self.planner.gate.share():  # other conversations' passes may be in flight too; no re-plan
            self._check(s)
            return await self._forward(s, tokens, drafts, sent, parents)

    def _check(self, s: RingSession) -> None:
        if why := self.planner.problem():  # never an answer from part of the model
            s.lost()
            raise RingError(f"the ring cannot answer: {why}")

    def _one_frame(self, s: RingSession, tokens: list[int], drafts: list[int]) -> bool:
        """A round (not a prompt or a replay, which go in chunks): it can go round with others' rounds."""
        n = len(tokens) - self.committed(s) + len(drafts)
        return 0 < n <= min(SHARED_CHUNK, chunk_positions(self.config.hidden_size,
                                                      DTYPES[self.planner.target.dtype].itemsize, wire.MAX_FRAME))

    async def _run_batch(self, rounds: list[Round]) -> None:
        """(the batcher) One pass for these rounds: alone, a round takes the ordinary path; together, one frame
        carries them all (peers/batcher.py). Sets each round's result or error."""
        async with self.planner.gate.share():
            together = []
            for r in rounds:
                try:
                    self._check(r.s)
                except RingError as e:
                    r.error = e
                    continue
                if len(rounds) == 1 or not self._one_frame(r.s, r.tokens, r.drafts):  # (a replay after a re-plan)
                    try:
                        r.result = await self._forward(r.s, r.tokens, r.drafts, r.sent, r.parents)
                    except RingError as e:
                        r.error = e
                else:
                    together.append(r)
            # as many rounds in one frame as its size allows (a frame's worth of positions), the rest in the next
            room = chunk_positions(self.config.hidden_size, DTYPES[self.planner.target.dtype].itemsize, wire.MAX_FRAME)
            while together:
                n, used = 0, 0
                while n < len(together) and (n == 0 or used + self._positions(together[n]) <= room):
                    used += self._positions(together[n])
                    n += 1
                await self._together(together[:n])
                together = together[n:]

    def _positions(self, r: Round) -> int:
        return len(r.tokens) - self.committed(r.s) + len(r.drafts)

    async def _together(self, rounds: list[Round]) -> None:
        t0 = time.perf_counter()
        items = []
        for r in rounds:
            committed = self.committed(r.s)
            if committed == 0:
                r.s.restart(self.epoch, self.shard.new_session())
            items.append((r, committed, r.tokens[committed:] + r.drafts))
        passes = [(r.s.cache, c, torch.tensor([ids], dtype=torch.long), r.parents) for r, c, ids in items]
        hs, (header, raw) = await trio.to_thread.run_sync(call_with_threads, self.threads, self._first_stage_many,
                                                          passes, bool(self.ring), limiter=self.compute)
        host_ms, trace, failed = (time.perf_counter() - t0) * 1e3, [], {}
        if self.ring:
            segments = [{"sid": r.s.sid, "committed": c, "n": len(ids), "n_logits": len(r.drafts) + 1,
                         **({"parents": r.parents} if r.parents is not None else {})} for r, c, ids in items]
            try:
                reply = await self._round_trip({"t": "fwd", "epoch": self.epoch, "sid": "", "committed": 0,
                                                "n_logits": 1, "batch": segments, "x": header, "raw": raw,
                                                "trace": []},
                                               sum(len(ids) for _, _, ids in items), [r.sent for r in rounds])
                h = validate.forward_frame(reply, self.config.hidden_size)
                back = validate.segments(reply, h.shape[1])
            except (RingError, wire.WireError) as e:
                for r in rounds:
                    r.s.lost()
                    r.error = e if isinstance(e, RingError) else RingError(f"the last member returned a bad frame: {e}")
                return
            failed, trace, at = dict(reply.get("failed") or {}), reply["trace"], {}
            for seg, (a, b) in zip(back, validate.bounds(back)):
                at[seg["sid"]] = h[:, a:b]
            hs = [at.get(r.s.sid) for r in rounds]
        t1 = time.perf_counter()
        done = [(r, c, ids, h) for (r, c, ids), h in zip(items, hs) if h is not None]
        outs = await trio.to_thread.run_sync(call_with_threads, self.threads, self._finish_many,
                                             [(h[0], len(r.drafts) + 1) for r, _, _, h in done], limiter=self.compute)
        head_ms, total_ms = (time.perf_counter() - t1) * 1e3, (time.perf_counter() - t0) * 1e3
        peers_ms = sum(ms for _, ms in trace)
        timing = {"host_ms": host_ms + head_ms, "peers": trace, "peers_ms": peers_ms, "batch": len(rounds),
                  "positions": sum(len(ids) for _, _, ids in items),
                  "network_ms": max(total_ms - host_ms - head_ms - peers_ms, 0.0), "pass_ms": total_ms}
        for (r, c, ids, _), (feats, logits, best) in zip(done, outs):
            r.s.passed(c, len(ids))
            r.s.features, r.s.best = (c, ids, feats), best
            r.result = (logits, timing)
            self.turns.went(r.s.sid)
        for r, _, _ in items:
            if r.result is None:
                r.s.lost()
                r.error = RingError(str(failed.get(r.s.sid) or "a member left this conversation out of the pass"))

    async def _round_trip(self, frame: dict, n_positions: int, sent: list, place: torch.Tensor | None = None) -> dict:
        """Send a pass to the first member and wait for the last one's reply (RingError if the ring fails it); the
        reply's hidden states land in `place` if they fit it."""
        seq = frame["seq"] = next(self.seq)
        send, recv = trio.open_memory_channel(1)
        self.waiting[(frame["sid"], seq)] = (send, place)
        try:
            await self.first_hop.send(frame)
            for event in sent:
                if event is not None:
                    event.set()  # the host's part is done: the round is on the wire
            reply = await self._await_reply(recv, self.pass_timeout(n_positions))
        except (ChannelClosed, trio.TooSlowError) as e:
            raise RingError(f"the ring did not answer: {e}") from None
        finally:
            del self.waiting[(frame["sid"], seq)]
        if reply["t"] == "fail":
            if reply.get("oom"):
                self.roster.out_of_memory(reply.get("member"), str(reply.get("error")))
            raise RingError(str(reply.get("error")))
        return reply

    async def _forward(self, s: RingSession, tokens: list[int], drafts: list[int],
                       sent: trio.Event | None, parents: list[int] | None) -> tuple[torch.Tensor, dict]:
        committed = self.committed(s)
        if committed == 0:
            s.restart(self.epoch, self.shard.new_session())
        ids, n_logits = tokens[committed:] + drafts, len(drafts) + 1
        t0 = time.perf_counter()
        # a long pass (a prompt, a replay) goes round in chunks that each fit a frame, the drafts in the last; each
        # chunk's `committed` is what the chunks before it left in every stage (the rollback rule, chunk by chunk).
        # While others answer, the chunks are short and take turns with their passes (peers/turns.py). The chunks'
        # hidden states come back into one tensor, each straight into its place.
        size = chunk_positions(self.config.hidden_size, DTYPES[self.planner.target.dtype].itemsize, wire.MAX_FRAME)
        h, host_ms, trace, a = None, 0.0, {}, 0
        while a < len(ids):
            if a:
                await self.turns.let_others_go(s.sid, stop=lambda: self.planner.gate.replanning)
            b = chunk_end(a, len(ids), SHARED_CHUNK if self.turns.others(s.sid) else size, n_logits)
            last = b == len(ids)
            if h is None and not last:
                h = self._pass_buffer(len(ids))
            place = h[:, a:b] if h is not None else None
            out, ms, chunk_trace = await self._chunk(s, committed + a, ids[a:b], parents if last else None,
                                                     n_logits if last else 1, sent if last else None, place)
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
        feats, logits, s.best = await trio.to_thread.run_sync(call_with_threads, self.threads, self._finish, h[0],
                                                              n_logits, limiter=self.compute)
        s.features = (committed, ids, feats)  # what a feature draft reads next
        self.turns.went(s.sid)
        head_ms = (time.perf_counter() - t1) * 1e3
        total_ms = (time.perf_counter() - t0) * 1e3
        peers_ms = sum(trace.values())
        return logits, {"host_ms": host_ms + head_ms, "peers": [[n, ms] for n, ms in trace.items()],
                        "peers_ms": peers_ms, "network_ms": max(total_ms - host_ms - head_ms - peers_ms, 0.0),
                        "pass_ms": total_ms}

    def _pass_buffer(self, n: int) -> torch.Tensor:
        """The hidden states [1, n, hidden] of a pass that goes round in chunks: on the host's device when it is
        alone, else on the CPU (pinned for a GPU) where the last hop's bytes land."""
        dtype = DTYPES[self.planner.target.dtype]
        if not self.ring:
            return torch.empty(1, n, self.config.hidden_size, dtype=dtype, device=self.device)
        return torch.empty(1, n, self.config.hidden_size, dtype=dtype, pin_memory=device.pinned(self.device))

    async def _chunk(self, s: RingSession, committed: int, ids: list[int], parents: list[int] | None,
                     n_logits: int, sent: trio.Event | None, place: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, float, list]:
        """Positions committed.. of one pass through the host's layers and round the ring: the last hidden states
        (in `place`, if given and they fit it), the host's milliseconds, and each member's."""
        t0 = time.perf_counter()
        x = torch.tensor([ids], dtype=torch.long)
        h, (header, raw) = await trio.to_thread.run_sync(call_with_threads, self.threads, self._first_stage, s.cache,
                                                         committed, x, parents, bool(self.ring), limiter=self.compute)
        host_ms = (time.perf_counter() - t0) * 1e3
        if not self.ring:
            return h, host_ms, []
        try:
            reply = await self._round_trip({"t": "fwd", "epoch": self.epoch, "sid": s.sid, "committed": committed,
                                            "n_logits": n_logits, "x": header, "raw": raw, "trace": [],
                                            **({"parents": parents} if parents is not None else {})},
                                           len(ids), [sent], place)
        except RingError:
            s.lost()
            raise
        try:
            h = validate.forward_frame(reply, self.config.hidden_size)
        except wire.WireError as e:
            raise RingError(f"the last member returned a bad frame: {e}") from None
        return h, host_ms, reply["trace"]

    def _landing(self, msg: dict, n: int) -> memoryview:
        """Where the last hop's hidden states land, once checked: in the place their pass keeps for them, if they
        fit it; else a buffer of their own (pinned if they go on to a GPU)."""
        place = self.waiting.get((msg.get("sid"), msg.get("seq")), (None, None))[1]
        return validate.landing(msg, n, self.config.hidden_size, device.pinned(self.device), place)

    def _first_stage(self, cache, committed: int, x: torch.Tensor, parents, pack: bool):
        """(worker thread) The host's layers and the frame's copy of them on the CPU, finished on the device (one
        event) before they are timed: trio's thread never waits for the device."""
        h = self.shard.forward(cache, committed, x, parents)
        out = tensors.host_bytes(h) if pack else (None, None)
        device.finish(self.device)
        return h, out

    def _first_stage_many(self, passes: list, pack: bool):
        """(worker thread) The host's layers over several conversations' passes at once (Shard.forward_many)."""
        hs = self.shard.forward_many(passes)
        out = tensors.host_bytes(torch.cat(hs, dim=1)) if pack else (None, None)
        device.finish(self.device)
        return hs, out

    def _finish_many(self, passes: list) -> list:
        """(worker thread) Features, logits and argmax ids (as _finish) of each conversation's pass, the head run
        once over all of them."""
        outs = self.shard.finish_many([(h.to(self.device, non_blocking=True), n) for h, n in passes]) if passes else []
        best = [logits.argmax(-1).cpu() for _, logits in outs]
        device.finish(self.device)
        return [(feats, logits, b.tolist()) for (feats, logits), b in zip(outs, best)]

    def _finish(self, h: torch.Tensor, n_logits: int):
        """(worker thread) Features, logits and each logits row's argmax (the target's greedy choice, taken where
        the logits are: only those ids come to the CPU), finished on the device before the pass's time is taken."""
        feats, logits = self.shard.finish(h.to(self.device, non_blocking=True), n_logits)
        best = logits.argmax(-1)
        if best.device.type != "cpu":
            best = torch.empty(best.shape, dtype=best.dtype, pin_memory=True).copy_(best, non_blocking=True)
        device.finish(self.device)
        return feats, logits, best.tolist()

    async def _await_reply(self, recv: trio.MemoryReceiveChannel, timeout: float) -> dict:
        """The pass's result, or RingError as soon as a ring member is declared lost."""
        deadline = trio.current_time() + timeout
        while trio.current_time() < deadline:
            with trio.move_on_after(0.1):
                return await recv.receive()
            lost = [m for m in self.ring if m.state == "lost"]
            if lost and lost[0].left:
                raise MemberLeft(f"member {lost[0].id} ({lost[0].name}) left")
            if lost:
                raise RingError(f"member {lost[0].id} ({lost[0].name}) was lost: {lost[0].error}")
        raise trio.TooSlowError

    def pass_timeout(self, n_tokens: int) -> float:
        return 60.0 + n_tokens * 0.5

    async def drop(self, s: RingSession) -> None:
        self.batcher.forget(s.sid)
        await self.roster.tell(self.ring, {"t": "drop", "sid": s.sid})

    async def close(self) -> None:
        self.roster.closing = True  # members leaving from now on is the normal end, not a loss
        await self.roster.tell(self.members, {"t": "bye"}, timeout=1)
