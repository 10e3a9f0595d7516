"""The host's pass engine: conversations' rounds gathered into passes, long passes (a prompt, a replay) in chunks,
each pass through the host's own layers and round the ring, and the logits from one run of the head.

A mixin of peers/host/host.py's Host, which keeps the ring (its planner, roster and first hop), serves and accepts
links; this half reads from it the plan (planner, ring, epoch, shard), the host's stage, the return link, the
batcher, the turns long passes take, and the model's config.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import trio

from peers.base.dtypes import DTYPES
from peers.base.errors import ConversationLost, MemberLeft, RingError
from peers.compute import device
from peers.host.batcher import Replay, Round
from peers.host.session import RingSession
from peers.host.turns import SHARED_CHUNK
from peers.links.channel import ChannelClosed
from peers.plan.layers import chunk_end, chunk_positions
from peers.wire import codec as wire, schema as validate

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


class PassEngine:
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
            try:
                return await self.batcher.submit(Round(s, tokens, drafts, parents, sent))
            except Replay:  # a re-plan came while it waited: now a replay, in chunks of its own
                pass
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
                    else:  # a re-plan came while it waited: a replay now, which goes in chunks outside the batch
                        r.error = Replay()  # (inside, its chunks would wait for turns the batch itself holds up)
                except RingError as e:
                    r.error = e
            frames = self._frames(ready)
            if len(frames) == 1:
                return await self._rounds(frames[0])
            async with trio.open_nursery() as nursery:  # all on the wire at once: each answered as it comes back
                for frame in frames:
                    nursery.start_soon(self._frame_alone, frame)

    def _frames(self, ready: list[Round]) -> list[list[Round]]:
        """The rounds in frames, in order: a frame's worth of positions each, but a frame that carries a replay
        (a conversation the ring held before, from its first position again after a re-plan) SHARED_CHUNK at
        most. A round's answer waits for its whole frame's pass, and after a re-plan every conversation replays
        at once: in one frame, none would have its next token before the last of them was computed. (Prompts
        share frames: on shared cores two passes cost about twice one, and new prompts come all the time.)"""
        room, frames, used, replays = self._frame_positions(), [], 0, False
        for r in ready:
            n, replay = self._positions(r), self._replays(r)
            if frames and used + n <= (SHARED_CHUNK if replays or replay else room):
                frames[-1].append(r)
                used, replays = used + n, replays or replay
            else:
                frames.append([r])
                used, replays = n, replay
        return frames

    def _replays(self, r: Round) -> bool:
        """Whether round `r` feeds its conversation again from position 0: the ring held some of it before
        (a pass filled it), and after a re-plan or a failed pass holds none."""
        return r.committed is None and r.s.filled > 0 and self.committed(r.s) == 0

    async def _frame_alone(self, rounds: list[Round]) -> None:
        """One frame of a batch sent as several: its rounds answered when it comes back, its failure theirs."""
        try:
            await self._rounds(rounds)
        except Exception as e:  # noqa: BLE001 - (as the batcher fails a whole batch: peers/host/batcher.py)
            for r in rounds:
                if r.result is None and r.error is None:
                    r.error = e
        for r in rounds:
            r.done.set()

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
        self._watch_speeds(host_ms, trace, timing["positions"])
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
                why = failed.get(r.s.sid) or "a member left this conversation out of the pass"
                r.error = ConversationLost(str(why))

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
                raise ConversationLost(str(failed.get(s.sid) or "a member left this conversation out of the pass"))
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
