"""The speculative decoding loop on the host: draft K tokens, verify all K+1 positions in one ring pass.

While a round is on the wire the drafter keeps drafting as if the round will be fully accepted and the target's
bonus token will equal the draft's own next guess; when that comes true the next round starts at once with
drafts that cost nothing on the critical path, otherwise that look-ahead is thrown away.

A drafter that ranks its guesses drafts a tree instead of a chain (peers/speculation/tree.py): its second and third guesses
where they are likely enough, verified in the same pass; greedy rounds walk it by the target's argmax, sampled
ones by recursive rejection sampling (peers/speculation/tree_sampling.py).
"""
from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field

import torch
import trio

from peers.speculation.adaptive import KPolicy
from peers.speculation.drafting import Drafter
from peers.base.errors import ConversationLost, MemberLeft
from peers.host.host import Host, RingError, RingSession
from peers.speculation.in_flight import Flight
from peers.speculation.logprobs import TokenLogprob, token_logprobs
from peers.speculation.sampling import SamplingParams, verify_sampling
from peers.speculation.stats import RoundStats, RunningStats
from peers.speculation.tree import Draft, chain, on_chain, verify_greedy
from peers.base.tree_layout import depths
from peers.speculation.tree_sampling import verify_tree

log = logging.getLogger("sfchat.generate")
WARM_ROUNDS = 3  # plain rounds a policy measures before rounds go in flight


@dataclass
class Ahead:
    """What a look-ahead drafted during a pass, for a next round that starts from `context` (the tokens there if the
    bet comes true)."""

    context: list[int]
    as_tree: bool  # drafted as a tree (with every node's chance) or as a chain (a model draft's have none)
    draft: Draft | None = None
    done: bool = False  # it finished before the reply came (a tree stopped half way is not used)
    ms: float = 0.0


class LookAhead:
    """The one look-ahead an answer carries from a round to the next. A round's pass bets that its whole main chain
    is accepted and that the target's next token is the guess; the look-ahead is kept only if that came true, and
    lost with a failed pass."""

    def __init__(self):
        self._ahead: Ahead | None = None

    def bet(self, tokens: list[int], draft: Draft, wanted: bool, as_tree: bool) -> Ahead | None:
        """The look-ahead to draft while this round's pass is on the wire (None: no bet, so none is left)."""
        self._ahead = None
        if wanted and draft.guess is not None:
            self._ahead = Ahead(tokens + draft.tokens[:draft.chain] + [draft.guess], as_tree)
        return self._ahead

    def settle(self, draft: Draft, path: list[int], nxt: int) -> None:
        """Keep the look-ahead only if the target took the branch it bet on."""
        if not (path == list(range(draft.chain)) and nxt == draft.guess):
            self._ahead = None

    def lose(self) -> None:
        self._ahead = None

    def for_context(self, tokens: list[int], as_tree: bool) -> Ahead | None:
        """The look-ahead made for exactly these tokens, if there is one, drafted the way this round drafts: a
        chain's carries no chances for a tree round to choose by, and a tree's nodes are no chain."""
        a = self._ahead
        return a if a is not None and a.context == tokens and a.as_tree == as_tree else None


@dataclass
class Result:
    token_ids: list[int]
    finish: str  # eos, length, stopped
    stats: RunningStats
    rounds: list[dict]
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per token, with params.logprobs set


async def generate(host: Host, rs: RingSession, tokens: list[int], **kw) -> Result:
    """The answer's rounds (`answer_rounds`), with the host knowing that this conversation is answering: another one's
    long prompt takes turns with them (peers/host/turns.py)."""
    try:
        with host.turns.answering(rs.sid):
            return await answer_rounds(host, rs, tokens, **kw)
    finally:
        host.between_answers()  # (a re-plan for speed, if a member's speed drifted)


async def answer_rounds(host: Host, rs: RingSession, tokens: list[int], *, drafter: Drafter,
                        params: SamplingParams, policy: KPolicy, max_new_tokens: int, eos: set[int], on_round=None,
                        should_stop=None, overlap: bool = True, max_retries: int = 3) -> Result:
    """Extend `tokens` (the whole conversation so far) in place; returns the new ids and the statistics.

    Each round is one `Speculation.round`. A failed pass commits nothing: the ring is re-planned and the round tried
    again, up to max_retries failures in a row (a long answer may ride out several incidents)."""
    if params.seed is None:
        params.seed = random.randrange(2**31)
    speculation = Speculation(host, rs, drafter, params, policy, eos, overlap)
    stats, rounds, start, logprobs = RunningStats(), [], len(tokens), []
    finish, retries, plain = "length", 0, False
    failed_at = None  # when a pass of this answer failed, until its next round (the debug log says how long)

    def report(r: RoundStats, new: list[int], lps: list[TokenLogprob] = ()) -> None:
        nonlocal failed_at
        if failed_at is not None:
            log.debug("%s: a round again %.2f s after its pass failed", rs.sid[:8], time.monotonic() - failed_at)
            failed_at = None
        stats.add(r)
        rounds.append(r.to_dict())
        logprobs.extend(lps)
        if on_round is not None:
            on_round({"event": "round", "round": r.to_dict(), "new": new, "stats": stats.summary(),
                      "logprobs": list(lps)})

    while len(tokens) - start < max_new_tokens:
        if should_stop is not None and should_stop():
            finish = "stopped"
            break
        epoch = host.epoch  # the plan this round starts under: a failure is recovered from once per plan
        try:
            # rounds in flight after plain rounds: the first brings the prompt's logits, and a few more tell the
            # policy what a pass costs
            if plain and policy.rounds >= WARM_ROUNDS and host.committed(rs) and params.grammar is None \
                    and _can_fly(host, drafter, policy):  # (a grammar's state follows one answer's rounds)
                flight = Flight(host, rs, drafter, params, policy, eos, tokens)
                if await flight.run(max_new_tokens - (len(tokens) - start),
                                    lambda r, new: report(r, new, flight.logprobs), should_stop):
                    finish = "eos"
                    break
                speculation.look_ahead.lose()  # (made before the flight)
                continue  # made them all, was stopped, or left flight (the policy keeps one at a time again)
            r, new, at_eos = await speculation.round(tokens, max_new_tokens - (len(tokens) - start))
            plain = True
        except RingError as failure:
            plain = False
            retries += 1
            if retries > max_retries:
                raise
            if on_round is not None:
                on_round({"event": "recovering", "error": str(failure)})
            failed_at = failed_at or time.monotonic()
            if isinstance(failure, ConversationLost):  # this conversation's caches only: it replays, alone
                log.info("%s; replaying this conversation", failure)
                continue
            if isinstance(failure, MemberLeft):  # a departure, not a failure
                log.info("%s; re-planning and replaying", failure)
            else:
                log.warning("ring pass failed (%s); re-planning and replaying", failure)
            await host.recover(epoch)
            continue
        retries = 0
        report(r, new, speculation.logprobs)
        if at_eos:
            finish = "eos"
            break
    return Result(tokens[start:], finish, stats, rounds, logprobs)


def _can_fly(host: Host, drafter: Drafter, policy: KPolicy) -> bool:
    """Whether an answer keeps several rounds in flight (peers/speculation/in_flight.py): over a ring of members, with a drafter
    of trees (not with --no-trees), where the policy (--in-flight, or what it measured) keeps more than one."""
    return bool(host.ring) and policy.rounds_in_flight() > 1 and policy.trees and drafter.name != "none" \
        and hasattr(drafter, "propose_tree")


@dataclass
class Speculation:
    """The rounds of one answer: what they share, and the look-ahead one round leaves to the next."""

    host: Host
    rs: RingSession
    drafter: Drafter
    params: SamplingParams
    policy: KPolicy
    eos: set[int]
    overlap: bool
    look_ahead: LookAhead = field(default_factory=LookAhead)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # the last round's, with params.logprobs set

    async def round(self, tokens: list[int], left: int) -> tuple[RoundStats, list[int], bool]:
        """One round: plan, draft, pass, verify, commit. Appends at most `left` tokens to `tokens` and returns the
        round's statistics, the new tokens and whether they end at an end-of-sequence token. A failed pass raises
        RingError with nothing committed."""
        t_round = time.perf_counter()
        k, floor, as_tree = self._plan(left)
        t0 = time.perf_counter()
        draft, hidden_ms = await self._draft(tokens, k, floor, as_tree)
        draft_ms = (time.perf_counter() - t0) * 1e3
        pending = len(tokens) - self.host.committed(self.rs)  # tokens the ring lacks, carried before the drafts
        if self.params.grammar is not None:  # no position spent on a token the grammar refuses
            draft = self.params.grammar.fit(draft)
        by_confidence = floor > 0 and (self.params.greedy or as_tree)
        if by_confidence:  # as many of the likeliest drafts as the pass costs of this ring make worth it
            draft = draft.likeliest(self.policy.select(draft.sure, pending))
        elif as_tree:  # --tree-nodes N
            draft = draft.likeliest(self.policy.nodes())
        logits, timing = await self._pass(tokens, draft, as_tree, k, floor)
        t1 = time.perf_counter()
        path, nxt = self._verify(logits, draft, len(tokens))
        verify_ms = (time.perf_counter() - t1) * 1e3
        self._observe(draft, path)
        self.look_ahead.settle(draft, path, nxt)
        new, at_eos = self._commit(tokens, draft, path, nxt, left)
        if self.params.logprobs is not None:  # row 0: after the last token; row i + 1: after node i
            rows = ([0] + [i + 1 for i in path])[:len(new)]
            self.logprobs = token_logprobs(logits[rows], new, self.params.logprobs)
        drafts = draft.tokens
        r = RoundStats(k=len(drafts) if floor else k, drafted=len(drafts), accepted=len(path), committed=len(new),
                       draft_ms=round(draft_ms, 3), hidden_draft_ms=round(hidden_ms, 3),
                       network_ms=round(timing["network_ms"], 3), host_ms=round(timing["host_ms"], 3),
                       peers=timing["peers"], verify_ms=round(verify_ms, 3),
                       round_ms=round((time.perf_counter() - t_round) * 1e3, 3), tree=as_tree,
                       depth=max(depths(draft.parents), default=0), batch=timing.get("batch", 1))
        if r.batch == 1 and pending <= 2:  # a round alone on the ring: what rounds in flight are sized by
            self.policy.stages(timing)
        self.policy.pace(False, len(new), r.round_ms)
        # a pass that carried B conversations' rounds: the policy weighs a draft against what the whole pass
        # makes per ms, and what a position costs by all the positions it carried (peers/speculation/adaptive.py)
        own = pending + len(drafts)
        self.policy.update(len(drafts), len(path), timing["pass_ms"] + verify_ms, own,
                           sum(draft.sure) if by_confidence and self.params.greedy else None, share=1 / r.batch,
                           others=max(timing.get("positions", own) - own, 0))
        return r, new, at_eos

    def _plan(self, left: int) -> tuple[int, float, bool]:
        """K drafts, or up to K while the drafter's confidence stays above the floor (peers/speculation/adaptive.py); and
        whether they form a tree (a tree's K is its depth at most)."""
        d = self.drafter
        as_tree = d.trees and self.policy.trees
        k, floor = self.policy.plan(d.ms_per_token, d.confident or as_tree) if d.name != "none" else (0, 0.0)
        k = min(k, left - 1)
        return k, floor, as_tree and k > 0 and (floor > 0 or self.policy.tree_nodes is not None)

    async def _draft(self, tokens: list[int], k: int, floor: float, as_tree: bool) -> tuple[Draft, float]:
        ahead = self.look_ahead.for_context(tokens, as_tree)
        if as_tree:
            return await _tree(self.drafter, tokens, ahead, floor, k, self.policy.nodes(), self.params)
        # one draft more than K, the guess at the target's bonus token, when a look-ahead can build on it (it
        # drafts while the round is on the wire: a ring with peers)
        want = k + 1 if self.overlap and self.host.ring and k > 0 else k
        return await _chain(self.drafter, tokens, ahead, want, k, floor, self.params)

    async def _pass(self, tokens: list[int], draft: Draft, as_tree: bool, k: int,
                    floor: float) -> tuple[torch.Tensor, dict]:
        """The ring pass, with the next round's look-ahead drafting while it is on the wire."""
        stop, sent = threading.Event(), trio.Event()
        ahead = self.look_ahead.bet(tokens, draft, self.overlap and bool(self.host.ring), as_tree)
        failure = None
        async with trio.open_nursery() as nursery:
            if ahead is not None:
                nursery.start_soon(_look_ahead, self.drafter, ahead, as_tree, k + 1, floor, self.params, stop, sent,
                                   self.policy.nodes())
            try:
                result = await self.host.forward(self.rs, tokens, draft.tokens, sent=sent,
                                                       parents=draft.parents if as_tree else None)
            except RingError as e:  # caught here, raised below: the nursery would wrap it in a group
                failure = e
            finally:
                stop.set()
                sent.set()  # a look-ahead still waiting for the wire wakes, sees stop, and returns
        if failure is not None:
            self.look_ahead.lose()  # the round is tried again from the same tokens
            raise failure
        return result

    def _verify(self, logits: torch.Tensor, draft: Draft, position: int) -> tuple[list[int], int]:
        """The accepted path through the drafts and the target's own next token."""
        if self.params.grammar is not None:  # each row masked where the grammar stands (peers/speculation/grammar.py)
            return self.params.grammar.verify(logits, draft, self.params, position)
        if self.params.greedy:
            return verify_greedy(self.rs.best, draft.tokens, draft.parents)  # the argmax came with the logits
        # the target's draw at each position is its own, keyed by (seed, position), whatever the draft's q: a
        # seeded answer is the same with any drafter, tree or none (peers/speculation/sampling.py)
        p = self.params.probs(logits)
        if draft.parents != chain(draft.tokens):
            return verify_tree(p, None, draft.tokens, draft.parents, self.params.seed, position)
        n_acc, nxt = verify_sampling(p, None, draft.tokens, self.params.seed, position)
        return list(range(n_acc)), nxt

    def _observe(self, draft: Draft, path: list[int]) -> None:
        """The target's features along the accepted path, for a feature draft."""
        if self.rs.features is None:
            return
        first, ids, feats = self.rs.features
        n = len(draft.tokens)
        keep = list(range(len(ids) - n)) + [len(ids) - n + i for i in path]
        self.drafter.observe(first, [ids[i] for i in keep], feats[keep])

    def _commit(self, tokens: list[int], draft: Draft, path: list[int], nxt: int,
                left: int) -> tuple[list[int], bool]:
        """Append the accepted drafts and the target's token (up to an end of sequence, at most `left`)."""
        new, at_eos = [draft.tokens[i] for i in path] + [nxt], False
        for i, t in enumerate(new):
            if t in self.eos:
                new, at_eos = new[: i + 1], True
                break
        new = new[:left]
        # every stage keeps the conversation and the accepted drafts of the main chain (the next frame trims the
        # rest); accepted tokens off the main chain go round again with the next round's drafts
        self.rs.set_position(min(len(tokens) + on_chain(path), len(tokens) + len(new) - 1), len(tokens) + len(new))
        tokens += new
        return new, at_eos


async def _chain(drafter: Drafter, tokens: list[int], ahead: Ahead | None, want: int, k: int, floor: float,
                 params: SamplingParams) -> tuple[Draft, float]:
    """Up to k drafts in a row (what the look-ahead made, if its bet came true, then more if needed), and the
    guess after them; and the share of the look-ahead's time this round uses."""
    drafts, q, sure, hidden_ms = [], None, [], 0.0
    if ahead is not None and ahead.draft is not None and ahead.draft.tokens:
        a = ahead.draft
        used = min(len(a.tokens), want)
        drafts, q = a.tokens[:used], (a.q[:used] if a.q is not None else None)
        sure, hidden_ms = list(a.sure[:used]), ahead.ms * used / len(a.tokens)
    if len(drafts) < want and not (sure and sure[-1] < floor):
        more, mq = await drafter.draft(tokens + drafts, want - len(drafts), params, floor=floor,
                                       prior=sure[-1] if sure else 1.0)
        drafts += more
        sure += list(drafter.confidence)
        q = mq if q is None else (torch.cat([q, mq]) if mq is not None else q)
    if floor:  # the drafts it is sure enough of; the first one below the floor is only a guess
        k = min(k, sum(s >= floor for s in sure))  # (confidences only fall along a draft)
    return Draft(drafts[:k], chain(drafts[:k]), sure[:k], q[:k] if q is not None else None,
                 drafts[k] if len(drafts) > k else None), hidden_ms


async def _tree(drafter: Drafter, tokens: list[int], ahead: Ahead | None, floor: float, depth: int,
                max_nodes: int, params: SamplingParams) -> tuple[Draft, float]:
    """A tree of drafts: the look-ahead's, if its bet came true and it finished, else a new one."""
    if ahead is not None and ahead.done and ahead.draft.tokens:
        return ahead.draft, ahead.ms
    return await drafter.draft_tree(tokens, floor, depth, max_nodes, params=params), 0.0


async def _look_ahead(drafter: Drafter, ahead: Ahead, as_tree: bool, n: int, floor: float, params: SamplingParams,
                      stop: threading.Event, sent: trio.Event, max_nodes: int) -> None:
    # only once the frame is on the wire: before that the host computes its own layers, on the same cores
    await sent.wait()
    if stop.is_set():
        return
    t0 = time.perf_counter()
    if as_tree:
        ahead.draft = await drafter.draft_tree(ahead.context, floor, n - 1, max_nodes, stop, params)
    else:
        tokens, q = await drafter.draft(ahead.context, n, params, stop, floor)
        ahead.draft = Draft(tokens, chain(tokens), list(drafter.confidence), q)
    ahead.done = not stop.is_set()
    ahead.ms = (time.perf_counter() - t0) * 1e3
