"""The speculative decoding loop on the host: draft K tokens, verify all K+1 positions in one ring pass.

While a round is on the wire the drafter keeps drafting as if the round will be fully accepted and the target's
bonus token will equal the draft's own next guess; when that comes true the next round starts at once with
drafts that cost nothing on the critical path, otherwise that look-ahead is thrown away.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field
from functools import partial

import torch
import trio

from .adaptive import KPolicy
from .drafters import Drafter
from .host import Host, RingError, RingSession
from .sampling import SamplingParams, verify_greedy, verify_sampling
from .stats import RoundStats, RunningStats

log = logging.getLogger("sfchat.generate")


@dataclass
class Ahead:
    context: list[int]
    tokens: list[int] = field(default_factory=list)
    q: torch.Tensor | None = None
    sure: list[float] = field(default_factory=list)  # the drafter's confidence in each token and all before it
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
        # one draft more than K, the guess at the target's bonus token, when a look-ahead can build on it (it
        # drafts while the round is on the wire: a ring with peers)
        want = k + 1 if overlap and host.ring and k > 0 else k
        # drafts: what the look-ahead made, if its assumption came true, then more if needed
        drafts, q, sure, hidden_ms = [], None, [], 0.0
        if ahead is not None and ahead.context == tokens and ahead.tokens:
            used = min(len(ahead.tokens), want)
            drafts, q = ahead.tokens[:used], (ahead.q[:used] if ahead.q is not None else None)
            sure, hidden_ms = list(ahead.sure[:used]), ahead.ms * used / len(ahead.tokens)
        t0 = time.perf_counter()
        if len(drafts) < want and not (sure and sure[-1] < floor):
            propose = partial(drafter.propose, floor=floor, prior=sure[-1] if sure else 1.0)
            more, mq = await trio.to_thread.run_sync(propose, tokens + drafts, want - len(drafts), params)
            drafts += more
            sure += list(drafter.confidence)
            q = mq if q is None else (torch.cat([q, mq]) if mq is not None else q)
        draft_ms = (time.perf_counter() - t0) * 1e3
        if floor:  # the drafts it is sure enough of; the first one below the floor is only a guess
            k = min(k, sum(s >= floor for s in sure))  # (confidences only fall along a draft)
        guess = drafts[k] if len(drafts) > k else None  # the draft's bet on the target's bonus token
        drafts = drafts[:k]
        q = q[: len(drafts)] if q is not None else None
        positions = len(tokens) - host.committed(rs) + len(drafts)  # what this pass carries through the ring
        stop, sent = threading.Event(), trio.Event()
        ahead = Ahead(tokens + drafts + [guess]) if (overlap and guess is not None) else None
        failure = None
        async with trio.open_nursery() as nursery:
            if ahead is not None:
                nursery.start_soon(_look_ahead, drafter, ahead, want, floor, params, stop, sent)
            try:
                logits, timing = await host.forward(rs, tokens, drafts, sent=sent)
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
        if rs.features is not None:
            drafter.observe(*rs.features)
        t1 = time.perf_counter()
        if params.greedy:
            n_acc, nxt = verify_greedy(logits, drafts)
        else:
            p = params.probs(logits)
            n_acc, nxt = verify_sampling(p, q, drafts, params.seed, len(tokens))
        verify_ms = (time.perf_counter() - t1) * 1e3
        new = drafts[:n_acc] + [nxt]
        if ahead is not None and not (n_acc == len(drafts) and nxt == guess):
            ahead = None  # the look-ahead drafted on a branch the target did not take
        for i, t in enumerate(new):
            if t in eos:
                new, finish = new[: i + 1], "eos"
                break
        new = new[:left]
        tokens += new
        rs.ring_len = min(rs.ring_len, len(tokens) - 1)  # rejected drafts are rolled back by the next frame
        r = RoundStats(k=k, drafted=len(drafts), accepted=n_acc, committed=len(new), draft_ms=round(draft_ms, 3),
                       hidden_draft_ms=round(hidden_ms, 3), network_ms=round(timing["network_ms"], 3),
                       host_ms=round(timing["host_ms"], 3), peers=timing["peers"], verify_ms=round(verify_ms, 3),
                       round_ms=round((time.perf_counter() - t_round) * 1e3, 3))
        policy.update(len(drafts), n_acc, timing["pass_ms"] + verify_ms, positions)
        stats.add(r)
        rounds.append(r.to_dict())
        if on_round is not None:
            on_round({"event": "round", "round": r.to_dict(), "new": new, "stats": stats.summary()})
        if finish == "eos":
            break
    return Result(tokens[start:], finish, stats, rounds)


async def _look_ahead(drafter: Drafter, ahead: Ahead, n: int, floor: float, params: SamplingParams,
                      stop: threading.Event, sent: trio.Event) -> None:
    # only once the frame is on the wire: before that the host computes its own layers, on the same cores
    await sent.wait()
    if stop.is_set():
        return
    t0 = time.perf_counter()
    propose = partial(drafter.propose, stop=stop, floor=floor)
    ahead.tokens, ahead.q = await trio.to_thread.run_sync(propose, ahead.context, n, params)
    ahead.sure = list(drafter.confidence)
    ahead.ms = (time.perf_counter() - t0) * 1e3
