"""The speculative decoding loop on the host: draft K tokens, verify all K+1 positions in one ring pass.

While a round is on the wire the drafter keeps drafting as if the round will be fully accepted and the target's
bonus token will equal the draft's own next guess; when that comes true the next round starts at once with
drafts that cost nothing on the critical path, otherwise that look-ahead is thrown away.

A greedy round with a drafter that knows its confidence drafts a tree instead of a chain (peers/tree.py): its
second and third guesses where they are likely enough, verified in the same pass.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass
from functools import partial

import torch
import trio

from .adaptive import KPolicy
from .drafting import Drafter
from .host import Host, RingError, RingSession
from .sampling import SamplingParams, verify_sampling
from .stats import RoundStats, RunningStats
from .tree import MAX_NODES, Draft, chain, on_chain, verify_greedy

log = logging.getLogger("sfchat.generate")


@dataclass
class Ahead:
    context: list[int]
    draft: Draft | None = None
    done: bool = False  # it finished before the reply came (a tree stopped half way is not used)
    ms: float = 0.0


@dataclass
class Result:
    token_ids: list[int]
    finish: str  # eos, length, stopped
    stats: RunningStats
    rounds: list[dict]


async def generate(host: Host, rs: RingSession, tokens: list[int], *, drafter: Drafter, params: SamplingParams,
                   policy: KPolicy, max_new_tokens: int, eos: set[int], on_round=None, should_stop=None,
                   overlap: bool = True, max_retries: int = 3) -> Result:
    """Extend `tokens` (the whole conversation so far) in place; returns the new ids and the statistics."""
    if params.seed is None:
        params.seed = random.randrange(2**31)
    stats, rounds, start = RunningStats(), [], len(tokens)
    ahead: Ahead | None = None
    finish, retries = "length", 0
    while len(tokens) - start < max_new_tokens:
        if should_stop is not None and should_stop():
            finish = "stopped"
            break
        t_round = time.perf_counter()
        left = max_new_tokens - (len(tokens) - start)
        # K drafts, or up to K while the drafter's confidence stays above the floor (peers/adaptive.py)
        k, floor = policy.plan(drafter.ms_per_token, drafter.confident) if drafter.name != "none" else (0, 0.0)
        k = min(k, left - 1)
        as_tree = drafter.trees and params.greedy and floor > 0 and k > 0
        t0 = time.perf_counter()
        if as_tree:
            draft, hidden_ms = await _tree(drafter, tokens, ahead, floor, k)
        else:
            # one draft more than K, the guess at the target's bonus token, when a look-ahead can build on it (it
            # drafts while the round is on the wire: a ring with peers)
            want = k + 1 if overlap and host.ring and k > 0 else k
            draft, hidden_ms = await _chain(drafter, tokens, ahead, want, k, floor, params)
        draft_ms = (time.perf_counter() - t0) * 1e3
        pending = len(tokens) - host.committed(rs)  # tokens the ring lacks, carried before the drafts
        by_confidence = params.greedy and floor > 0
        if by_confidence:  # as many of the likeliest drafts as the pass costs of this ring make worth it
            draft = draft.likeliest(policy.select(draft.sure, pending))
        drafts, main, guess = draft.tokens, draft.chain, draft.guess
        positions = pending + len(drafts)  # what this pass carries through the ring
        stop, sent = threading.Event(), trio.Event()
        # the look-ahead bets that the whole main chain is accepted and the target's next token is the guess
        ahead = Ahead(tokens + drafts[:main] + [guess]) if (overlap and host.ring and guess is not None) else None
        failure = None
        async with trio.open_nursery() as nursery:
            if ahead is not None:
                nursery.start_soon(_look_ahead, drafter, ahead, as_tree, k + 1, floor, params, stop, sent)
            try:
                logits, timing = await host.forward(rs, tokens, drafts, sent=sent,
                                                    parents=draft.parents if as_tree else None)
            except RingError as e:  # caught here, not outside: the nursery would wrap it in a group
                failure = e
            finally:
                stop.set()
                sent.set()  # a look-ahead still waiting for the wire wakes, sees stop, and returns
        if failure is not None:
            retries += 1
            if retries > max_retries:
                raise failure
            log.warning("ring pass failed (%s); re-planning and replaying", failure)
            if on_round is not None:
                on_round({"event": "recovering", "error": str(failure)})
            await host.recover()
            ahead = None
            continue
        retries = 0  # the limit is on failures in a row: a long answer may ride out several incidents
        t1 = time.perf_counter()
        if params.greedy:
            path, nxt = verify_greedy(logits, drafts, draft.parents)
        else:
            p = params.probs(logits)
            n_acc, nxt = verify_sampling(p, draft.q, drafts, params.seed, len(tokens))
            path = list(range(n_acc))
        verify_ms = (time.perf_counter() - t1) * 1e3
        if rs.features is not None:  # the target's features along the accepted path, for a feature draft
            first, ids, feats = rs.features
            keep = list(range(len(ids) - len(drafts))) + [len(ids) - len(drafts) + i for i in path]
            drafter.observe(first, [ids[i] for i in keep], feats[keep])
        if ahead is not None and not (path == list(range(main)) and nxt == guess):
            ahead = None  # the look-ahead drafted on a branch the target did not take
        new = [drafts[i] for i in path] + [nxt]
        for i, t in enumerate(new):
            if t in eos:
                new, finish = new[: i + 1], "eos"
                break
        new = new[:left]
        # every stage keeps the conversation and the accepted drafts of the main chain (the next frame trims the
        # rest); accepted tokens off the main chain go round again with the next round's drafts
        rs.ring_len = min(rs.ring_len, len(tokens) + on_chain(path), len(tokens) + len(new) - 1)
        tokens += new
        r = RoundStats(k=len(drafts) if floor else k, drafted=len(drafts), accepted=len(path), committed=len(new),
                       draft_ms=round(draft_ms, 3), hidden_draft_ms=round(hidden_ms, 3),
                       network_ms=round(timing["network_ms"], 3), host_ms=round(timing["host_ms"], 3),
                       peers=timing["peers"], verify_ms=round(verify_ms, 3),
                       round_ms=round((time.perf_counter() - t_round) * 1e3, 3), tree=as_tree)
        policy.update(len(drafts), len(path), timing["pass_ms"] + verify_ms, positions,
                      sum(draft.sure) if by_confidence else None)
        stats.add(r)
        rounds.append(r.to_dict())
        if on_round is not None:
            on_round({"event": "round", "round": r.to_dict(), "new": new, "stats": stats.summary()})
        if finish == "eos":
            break
    return Result(tokens[start:], finish, stats, rounds)


async def _chain(drafter: Drafter, tokens: list[int], ahead: Ahead | None, want: int, k: int, floor: float,
                 params: SamplingParams) -> tuple[Draft, float]:
    """Up to k drafts in a row (what the look-ahead made, if its bet came true, then more if needed), and the
    guess after them; and the share of the look-ahead's time this round uses."""
    drafts, q, sure, hidden_ms = [], None, [], 0.0
    if ahead is not None and ahead.context == tokens and ahead.draft is not None and ahead.draft.tokens:
        a = ahead.draft
        used = min(len(a.tokens), want)
        drafts, q = a.tokens[:used], (a.q[:used] if a.q is not None else None)
        sure, hidden_ms = list(a.sure[:used]), ahead.ms * used / len(a.tokens)
    if len(drafts) < want and not (sure and sure[-1] < floor):
        propose = partial(drafter.propose, floor=floor, prior=sure[-1] if sure else 1.0)
        more, mq = await trio.to_thread.run_sync(propose, tokens + drafts, want - len(drafts), params)
        drafts += more
        sure += list(drafter.confidence)
        q = mq if q is None else (torch.cat([q, mq]) if mq is not None else q)
    if floor:  # the drafts it is sure enough of; the first one below the floor is only a guess
        k = min(k, sum(s >= floor for s in sure))  # (confidences only fall along a draft)
    return Draft(drafts[:k], chain(drafts[:k]), sure[:k], q[:k] if q is not None else None,
                 drafts[k] if len(drafts) > k else None), hidden_ms


async def _tree(drafter: Drafter, tokens: list[int], ahead: Ahead | None, floor: float,
                depth: int) -> tuple[Draft, float]:
    """A tree of drafts: the look-ahead's, if its bet came true and it finished, else a new one."""
    if ahead is not None and ahead.context == tokens and ahead.done and ahead.draft.tokens:
        return ahead.draft, ahead.ms
    return await trio.to_thread.run_sync(drafter.propose_tree, tokens, floor, depth, MAX_NODES), 0.0


async def _look_ahead(drafter: Drafter, ahead: Ahead, as_tree: bool, n: int, floor: float, params: SamplingParams,
                      stop: threading.Event, sent: trio.Event) -> None:
    # only once the frame is on the wire: before that the host computes its own layers, on the same cores
    await sent.wait()
    if stop.is_set():
        return
    t0 = time.perf_counter()
    if as_tree:
        ahead.draft = await trio.to_thread.run_sync(drafter.propose_tree, ahead.context, floor, n - 1, MAX_NODES,
                                                    stop)
    else:
        propose = partial(drafter.propose, stop=stop, floor=floor)
        tokens, q = await trio.to_thread.run_sync(propose, ahead.context, n, params)
        ahead.draft = Draft(tokens, chain(tokens), list(drafter.confidence), q)
    ahead.done = not stop.is_set()
    ahead.ms = (time.perf_counter() - t0) * 1e3
