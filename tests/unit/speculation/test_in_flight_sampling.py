"""Rounds in flight keep the target's distribution: the first two tokens of many seeded sampled answers, each made
by peers/speculation/in_flight.py's Flight with three rounds on the "ring" at once, follow the target's exact joint
distribution (a chi-square bound at p = 1e-4), as tests/unit/speculation/test_lossless.py checks for one round's tree.

Target and draft are the fixed random tables of a 6-token vocabulary from tests/unit/speculation/test_lossless.py. The ring is a
stand-in that keeps, as every stage does, one token per cache column under the frames' rollback rule (`committed`,
`keep`, rows appended) and answers each row with the target's table at the context its column sees; its replies
come back one simulated second after each round went (trio's MockClock), so the hedges go out before the first
verdict lands, as they do over a slow link. Sampling the whole ring this many times would take hours; the Flight
and the verification it runs are the real ones.
"""
from __future__ import annotations

import torch
import trio
import trio.testing

from peers.speculation.adaptive import KPolicy
from peers.speculation.drafting.base import Drafter
from peers.speculation.drafting.grow import grow, run
from peers.speculation.in_flight import Flight
from peers.host.session import RingSession
from peers.speculation.sampling import SamplingParams
from peers.speculation.tree_sampling import sampled_children
from test_lossless import V, _chi_square, _critical, _p, _q

N = 4000
PROMPT = [3, 1, 4]


class TableDrafter(Drafter):
    """The draft's table: each node's children drawn without replacement from its q (as every sampled drafter
    draws them), at most two, each with its chance."""

    name, trees, confident = "table", True, True

    async def draft_tree(self, context, floor, depth, max_nodes, stop=None, params=None):
        return self.propose_tree(context, floor, depth, max_nodes, stop, params)  # (microseconds: no thread)

    def propose_tree(self, context, floor, depth, max_nodes, stop=None, params=None):
        gen = torch.Generator().manual_seed(hash((params.seed, tuple(context))) % 2**31)

        def guesses(path):
            q = _q(tuple(context) + path)
            return sampled_children(q, 2, gen), q

        paths = {-1: ()}

        def expand(level, tokens, parents):
            for i in level:
                paths[i] = paths[parents[i]] + (tokens[i],)
            return [guesses(paths[i]) for i in level]
            yield  # (a generator that never waits)

        return run(grow(guesses(()), expand, floor, depth, max_nodes, stop))


class TableRing:
    """The host's side of Flight: frames go to a stage that keeps tokens by column; replies a second later."""

    ring = ["stand-in"]

    def __init__(self, prompt: list[int]):
        self.columns = list(prompt[:-1])  # every prompt token but the last is on the ring
        self.rounds_ahead = 0
        self.frames = 0

    def committed(self, rs) -> int:
        return len(self.columns)

    def round_positions(self) -> int:
        return 64

    async def cancel(self, rounds) -> None:
        pass

    async def fly(self, r):
        self.frames += 1
        kept = [self.columns[c] for c in r.keep]
        self.columns = self.columns[: r.committed] + kept + list(r.tokens)
        seen = kept + list(r.tokens)  # the frame's columns after `committed`, in order
        rows = []
        for i in range(len(kept), len(seen)):
            path, j = [], i
            while j >= 0:
                path.insert(0, seen[j])
                j = r.parents[j]
            rows.append(_p(tuple(self.columns[: r.committed] + path)).log())
        r.seq = self.frames
        r.sent.set()
        await trio.sleep(1)
        logits = torch.stack(rows)
        return logits, {"best": logits.argmax(-1).tolist(), "feats": torch.zeros(len(rows), 1), "host_ms": 1.0,
                        "peers": [["a", 1.0]], "pass_ms": 3.0, "network_ms": 1.0}


async def _first_two(seed: int) -> tuple[tuple[int, int], int]:
    ring, tokens = TableRing(PROMPT), list(PROMPT)
    params = SamplingParams(1.0, seed=seed)
    flight = Flight(ring, RingSession(f"s{seed}"), TableDrafter(), params, KPolicy(in_flight=3, tree_nodes=2),
                    set(), tokens)
    hedged = []
    await flight.run(2, lambda r, new: hedged.append(r.in_flight))
    return tuple(tokens[len(PROMPT):][:2]), max(hedged)


def test_rounds_in_flight_keep_the_targets_distribution():
    async def main():
        counts, most = {}, 0
        for seed in range(N):
            pair, in_flight = await _first_two(seed)
            counts[pair] = counts.get(pair, 0) + 1
            most = max(most, in_flight)
        return counts, most

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # rows of 6 probabilities: a second thread only waits
    try:
        counts, most = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        torch.set_num_threads(threads)
    p0 = _p(tuple(PROMPT))
    exact = {(a, b): float(p0[a] * _p(tuple(PROMPT) + (a,))[b]) for a in range(V) for b in range(V)}
    chi2, df = _chi_square(counts, exact, N)
    assert most == 3  # rounds really were in flight together
    assert chi2 < _critical(df), (chi2, df)
