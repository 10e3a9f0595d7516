"""Rounds in flight: an answer keeps several speculative rounds on the ring at once (PipeInfer, arXiv 2407.11798;
PipeDec, 2504.04104), so a slow link is not idle while a round crosses it.

One tree of drafts lives across rounds. Its root is the answer's last committed token (the head); each node is a
draft below it with its chance of being reached (the drafter's probability of it given its parent, times its
parent's chance). A round carries nodes not sent yet. With nothing in flight it is a plain round: the tokens the
ring lacks and a tree under the head. While rounds are in flight, the next one is a hedge for the place they are
likeliest to stop without a child for the target's token: under a leaf (the bet that the path to it is accepted
in full), or beside the child already drafted at an inner node (the draft's next guess there), with the tree
under it, so that a hedge that is needed carries the answer on as a plain round would. Betting on full
acceptance alone gains little, since rejections cost a round trip each as before; a hedge that covers a
rejection keeps the round it is in useful.

Verdicts come back in the order the rounds went. Each walks down from the head while the target's choices are
known. A choice that is a child in the tree is committed at once, even while that child's own round is still on
the wire (its keys are on the ring already; only what comes after it waits). A choice that is not is committed as
the target's own token, and the rest of the tree is dead. A round in flight whose every node is dead is
cancelled: a member that has not started it skips it (peers/member/passes.py). Sampled rounds take the target's own draw
at a node, keyed by (seed, position), and the child that drafted it if there is one (peers/speculation/sampling.py);
a node's children are drafted once, in one draw: a sampled hedge grows only under nodes that have none.

The tree and the caches' layout are peers/speculation/flight_tree.py; here are the rounds: drafting them, sending
them, landing their verdicts.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import torch
import trio

from peers.speculation.adaptive import MAX_IN_FLIGHT, KPolicy
from peers.host.batcher import Round
from peers.speculation.drafting import Drafter
from peers.speculation.logprobs import TokenLogprob, token_logprobs
from peers.base.errors import RingError
from peers.host.host import Host, RingSession
from peers.speculation.sampling import SamplingParams
from peers.speculation.stats import RoundStats
from peers.speculation.flight_tree import Node, Tree

# a hedge's tree keeps the nodes at least this share as likely as the hedge: caught with nothing under it, a
# hedge gains one token and moves the next plain round later by that
HEDGE_TREE = 0.1


@dataclass(eq=False)
class Flying:
    """One round on the ring: its nodes in the frame's row order, and what came back."""

    nodes: list[Node]
    round: Round
    in_flight: int
    drafts: list[Node]  # its nodes that were drafts when it went (the others: tokens the ring lacked)
    draft_ms: float
    hidden: bool  # drafted while other rounds were on the wire
    landed: trio.Event = field(default_factory=trio.Event)
    result: tuple | None = None
    error: RingError | None = None
    cancelled: bool = False
    caught: bool = False
    ahead: bool = False  # it went while more than one round was allowed in flight


class Flight:
    """The rounds of one answer with several in flight. `run` extends `tokens` in place until the answer ends or
    `left` tokens are made; a failed round raises RingError with the session marked for a replay."""

    def __init__(self, host: Host, rs: RingSession, drafter: Drafter, params: SamplingParams, policy: KPolicy,
                 eos: set[int], tokens: list[int]):
        self.host, self.rs, self.drafter, self.params, self.policy, self.eos = host, rs, drafter, params, policy, eos
        self.tokens = tokens
        self.tree = Tree(tokens, host.committed(rs))
        self.flying: deque[Flying] = deque()
        self.last_landing = time.perf_counter()
        self.plain_nodes = 0  # the drafts of the last plain round (nothing in flight beside it)
        self.logprobs: list[TokenLogprob] = []  # the last verdict's, with params.logprobs set

    # --- the rounds ----------------------------------------------------------------------------------------

    async def next_round(self, left: int) -> Flying | None:
        """The next round to send, drafted now, or None when none is worth sending."""
        if any(g.error is not None for g in self.flying):
            return None  # a round failed: nothing more builds on it (its verdict raises the failure)
        unsent = self.tree.unsent()
        live = sum(not g.cancelled for g in self.flying)
        if not unsent and (not live or live >= self.policy.rounds_in_flight()):
            return None
        t0 = time.perf_counter()
        new = unsent + await self._draft(left, plain=not live, room=self.host.round_positions() - len(unsent))
        if not new:
            return None
        draft_ms = (time.perf_counter() - t0) * 1e3
        return self._frame(new, draft_ms, hidden=live > 0)

    async def _draft(self, left: int, plain: bool, room: int) -> list[Node]:
        """New draft nodes (at most `room`): a plain round's tree under the head, or a hedge: where a round in
        flight may stop, the draft's next guess there and the tree under it (a hedge alone, with nothing under
        it, would only move the next plain round later by a token)."""
        position_ms = min(self.policy.verify_ms, self.policy.busiest_ms / self.plain_nodes) if self.plain_nodes \
            else self.policy.verify_ms
        k, floor, nodes = self.policy.flight_plan(self.drafter.ms_per_token, plain, position_ms)
        k, nodes = min(k, left - 1), min(nodes, room)
        if not plain and self.plain_nodes:  # a hedge takes no more of every stage than a plain round does
            nodes = min(nodes, self.plain_nodes)
        if k <= 0:
            return []
        options = []  # (the chance it is needed, the stop it covers, its nodes with their chances)
        for chance, at in self.tree.ends(floor, self.params.greedy):
            context = self.tokens + self.tree.path(at, self.tree.head)
            # as many nodes as are below it already, and `nodes` more: the draft ranks the ones sent among them
            d = await self.drafter.draft_tree(context, floor / chance if chance else 1.0, k,
                                              nodes + self.tree.below(at), params=self.params)
            made = self.tree.graft(at, chance, d, self.params.greedy)
            guesses = {id(n) for _, n in made if n.parent is at}  # new children of the stop: the hedges
            mine = [(c, n) for c, n in made if id(self.tree.child_of(n, at)) in guesses]
            ours = {id(n) for _, n in mine}
            for _, n in made:  # the rest is under another stop (its own hedge is drafted there): out of the tree
                if id(n) not in ours and n in n.parent.children:
                    n.parent.children.remove(n)
            if mine:
                options.append((max(c for c, _ in mine), at, mine))
        options.sort(key=lambda o: -o[0])
        chosen: list[tuple[float, Node]] = []
        for i, (_, _, mine) in enumerate(options):
            if plain or i == 0:  # a plain round: the tree under the head; a hedge round: one stop's
                chosen += mine
        chosen.sort(key=lambda cn: -cn[0])  # (stable: a parent as likely as its child stays before it)
        if not plain and chosen and chosen[0][0] >= floor:  # a hedge worth sending, and the tree under it
            floor = chosen[0][0] * HEDGE_TREE
        chosen = [(c, n) for c, n in chosen[:nodes] if c >= floor]
        if plain and self.policy.tree_nodes is None:  # as many as the pass costs of this ring make worth it
            chosen = chosen[:self.policy.select([c for c, _ in chosen], len(self.tree.unsent()))]
        if plain:
            self.plain_nodes = max(len(chosen), 1)
        sent = {id(n) for _, n in chosen}
        for _, _, mine in options:  # what is not sent is not in the tree
            for _, n in mine:
                if id(n) not in sent and n in n.parent.children:
                    n.parent.children.remove(n)
        return sorted((n for _, n in chosen), key=lambda n: n.pos)

    def _frame(self, new: list[Node], draft_ms: float, hidden: bool) -> Flying:
        """The round for these new nodes, laid out in every stage's cache after the nodes still alive."""
        at = self.tree.lay_out(new)
        r = Round(self.rs, [n.token for n in new], [], at.parents, trio.Event(), committed=at.committed, keep=at.keep)
        f = Flying(new, r, 1 + sum(not g.cancelled for g in self.flying), [n for n in new if not n.committed],
                   draft_ms, hidden, ahead=self.policy.rounds_in_flight() > 1)
        for n in new:
            n.flight = f
        self.flying.append(f)
        return f

    async def fly(self, f: Flying) -> None:
        """(a task) Send the round and keep what comes back."""
        try:
            f.result = await self.host.fly(f.round)
        except RingError as e:
            f.error = e
        finally:
            f.round.sent.set()  # (a round that failed before it went) whoever waits to send the next goes on
            f.landed.set()

    async def run(self, left: int, report, should_stop=None) -> bool:
        """Rounds until `left` tokens are made, an end of sequence (returns True), should_stop() or the policy
        keeps one round at a time again (peers/speculation/adaptive.py); report(round
        statistics, new tokens) after each verdict. Every round sent has left the host when this returns, so the
        next pass of the conversation reaches every stage after them. A failed round raises RingError."""
        failure, at_eos = None, False
        self.host.rounds_ahead += MAX_IN_FLIGHT - 1  # the host's batcher lets them go out
        async with trio.open_nursery() as nursery:
            try:
                at_eos = await self._rounds(nursery, left, report, should_stop)
            except RingError as e:  # caught here, raised below: the nursery would wrap it in a group
                failure = e
            finally:
                with trio.CancelScope(shield=True):  # the members skip what is left of them
                    await self.host.cancel([(self.rs.sid, g.round.seq) for g in self.flying
                                            if not g.cancelled and g.round.seq is not None])
                nursery.cancel_scope.cancel()
        self.host.rounds_ahead -= MAX_IN_FLIGHT - 1
        self.settle()
        if failure is not None:
            raise failure
        return at_eos

    async def _rounds(self, nursery, left: int, report, should_stop) -> bool:
        made = 0
        while made < left and not (should_stop is not None and should_stop()):
            if made and not self.flying and self.policy.rounds_in_flight() <= 1:
                break  # the policy went back to one round at a time: the answer goes on in plain rounds
            while (f := await self.next_round(left - made)) is not None:
                nursery.start_soon(self.fly, f)
                await f.round.sent.wait()
            if not self.flying:
                break
            f = self.flying.popleft()
            await f.landed.wait()
            new, at_eos, cancel, r = self.land(f, left - made)
            made += len(new)
            if cancel:
                nursery.start_soon(self.host.cancel, cancel)
            report(r, new)
            if at_eos:
                return True
        return False

    # --- the verdicts --------------------------------------------------------------------------------------

    def land(self, f: Flying, left: int) -> tuple[list[int], bool, list[tuple[str, int]], RoundStats]:
        """The oldest round's reply: the target's choices at its nodes, then the walk from the head. Returns the
        tokens committed, whether they end the answer, the rounds to cancel, and the round's statistics."""
        if f.error is not None:
            self.rs.lost()
            raise f.error
        logits, timing = f.result
        t0 = time.perf_counter()
        if logits is not None:
            best, feats = timing["best"], timing["feats"]
            probs = None if self.params.greedy else self.params.probs(logits)
            for j, n in enumerate(f.nodes):
                if not n.dead:
                    n.best, n.feat = best[j], feats[j]
                    if probs is not None:
                        n.p = probs[j]
                    if self.params.logprobs is not None:
                        n.logits = logits[j]
        new, at_eos, rows = self.tree.walk(left, self.params, self.eos)
        self.tokens.extend(new)
        if self.params.logprobs is not None:
            self.logprobs = token_logprobs(torch.stack(rows), new, self.params.logprobs) if new else []
        verify_ms = (time.perf_counter() - t0) * 1e3
        self._observe()
        cancel = []
        for g in self.flying:
            if not g.cancelled and g.round.seq is not None and all(n.dead for n in g.nodes):
                g.cancelled = True
                cancel.append((self.rs.sid, g.round.seq))
        now = time.perf_counter()
        # every node of it is decided by now: its parent's round is this one or an earlier one
        accepted = sum(n.committed for n in f.drafts)
        depth = max(n.pos for n in f.drafts) - min(n.pos for n in f.drafts) + 1 if f.drafts else 0
        r = RoundStats(k=len(f.drafts), drafted=len(f.drafts), accepted=accepted, committed=len(new),
                       draft_ms=0.0 if f.hidden else round(f.draft_ms, 3),
                       hidden_draft_ms=round(f.draft_ms, 3) if f.hidden else 0.0,
                       network_ms=round(timing.get("network_ms", 0.0), 3),
                       host_ms=round(timing.get("host_ms", 0.0), 3), peers=timing.get("peers", []),
                       verify_ms=round(verify_ms, 3),
                       round_ms=round((now - self.last_landing) * 1e3, 3), tree=True,
                       depth=depth, batch=timing.get("batch", 1), in_flight=f.in_flight,
                       cancelled=f.cancelled or logits is None, caught=f.caught)
        self.last_landing = now
        self.policy.pace(f.ahead, len(new), r.round_ms)
        if logits is not None and f.in_flight == 1:  # (a round queued behind others says little of pass costs)
            self.policy.stages(timing)
            self.policy.update(len(f.drafts), accepted, timing["pass_ms"] + verify_ms, len(f.nodes),
                               share=1 / r.batch, others=max(timing.get("positions", len(f.nodes)) - len(f.nodes), 0))
        return new, at_eos, cancel, r

    def _observe(self) -> None:
        """The target's features at the committed tokens, in order, for a draft that reads them."""
        if done := self.tree.observed():
            self.drafter.observe(done[0].pos, [n.token for n in done], torch.stack([n.feat for n in done]))

    def settle(self) -> None:
        """(the answer ends, or a round failed) The session as the plain rounds keep it: every stage holds the
        committed positions in a row up to base (and lacks the last token, whose logits the next pass reads)."""
        self.rs.length = len(self.tokens)
        self.rs.filled = max(self.rs.filled, self.tree.base)
        self.rs.ring_len = min(self.tree.base, len(self.tokens) - 1)

