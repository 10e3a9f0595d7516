"""A drafter of known acceptance, for `sfchat bench` only: speculation measured where no real draft's acceptance
is known (random weights, say), every pass, hop and verification being real.

It knows the target's own greedy continuation (recorded from a plain run of the same prompt at temperature 0).
`simulated:A`: its first guess at each position is that token with probability A, else another token.
`simulated:A,B`: where the first guess is wrong, its second guess is right with probability B, so it drafts trees
(peers/speculation/tree.py): a node's first child has chance A of being the target's token, its second (1 - A) B. Under a
wrong guess, the target's continuation is unknown: the guesses there are other tokens. Every draw comes from a
generator seeded by the position (and a node's path): a token proposed twice (drafted ahead, then again) is the
same token, and a tree's first guesses are the chain's. Greedy rounds only. `simulated:A/A2/…` (each A or A,B)
runs a row for each.
"""
from __future__ import annotations

import random

from peers.speculation.tree import Draft
from peers.speculation.drafting.base import Drafter
from peers.speculation.drafting.choose import SIMULATED
from peers.speculation.drafting.grow import grow, run


def parse_simulated(spec: str | None) -> list[tuple[float, float]] | None:
    """The (acceptance, second guess) of each row of `simulated:A[,B][/A[,B]…]`, or None for any other spec; a
    bad number is a one-line ValueError."""
    if not spec or not spec.startswith(SIMULATED):
        return None
    out = []
    for row in spec[len(SIMULATED):].split("/"):
        values = []
        for text in row.split(","):
            try:
                a = float(text)
            except ValueError:
                a = -1.0
            if not 0.0 <= a <= 1.0:
                raise ValueError(f"--draft {spec}: a simulated acceptance is a number in 0..1")
            values.append(a)
        if len(values) > 2:
            raise ValueError(f"--draft {spec}: simulated:A or simulated:A,B (a second guess), rows apart by /")
        out.append((values[0], values[1] if len(values) > 1 else 0.0))
    return out


def simulated_name(acceptance: float, second: float = 0.0) -> str:
    return f"simulated acceptance {acceptance:g}" + (f", second guess {second:g}" if second else "")


class SimulatedDrafter(Drafter):
    confident = True  # it knows its chances: A for a first guess, (1 - A) B for a second

    def __init__(self, acceptance: float, vocab: int, references: list[list[int]] = (), seed: int = 0,
                 second: float = 0.0):
        self.acceptance, self.second, self.vocab, self.seed = acceptance, second, vocab, seed
        self.references = [list(r) for r in references]  # each a prompt and its greedy continuation
        self.name = simulated_name(acceptance, second)
        self.trees = second > 0

    def _reference(self, context: list[int], params) -> int | None:
        if not params.greedy:
            raise ValueError("a simulated draft proposes the greedy continuation: it needs temperature 0")
        return next((i for i, r in enumerate(self.references) if len(r) > len(context)
                     and r[:len(context)] == context), None)

    def _other(self, rng: random.Random, but: int) -> int:
        return (but + 1 + rng.randrange(self.vocab - 1)) % self.vocab  # any token but `but`

    def _first(self, ref: int, pos: int) -> int:
        """The first guess at position pos of the reference: right with probability A."""
        tok, rng = self.references[ref][pos], random.Random(f"{self.seed}:{ref}:{pos}")
        return tok if rng.random() < self.acceptance else self._other(rng, tok)

    def propose(self, context, n, params, stop=None, floor=0.0, prior=1.0):
        ref = self._reference(context, params)
        self.confidence = []
        if ref is None:  # past what the plain run made, or another prompt
            return [], None
        out, sure = [], prior
        for pos in range(len(context), min(len(context) + n, len(self.references[ref]))):
            out.append(self._first(ref, pos))
            sure *= self.acceptance
            self.confidence.append(sure)
            if sure < floor:
                break
        self._measure(0.0, len(out))
        return out, None

    def propose_tree(self, context, floor, depth, max_nodes, stop=None, params=None) -> Draft:
        ref = self._reference(context, params)
        if ref is None:
            self.confidence = []
            return Draft()
        truth, start = self.references[ref], len(context)
        paths: dict[int, tuple[int, ...]] = {-1: ()}

        def guesses(path: tuple[int, ...]):
            """A node's two guesses and their chances; `path`: the drafts from the root down to it."""
            pos = start + len(path)
            if pos >= len(truth):
                return [], None
            right = truth[pos]
            rng = random.Random(f"{self.seed}:{ref}:{start}:{path}")
            if tuple(truth[start:pos]) == path:  # on the target's continuation
                first = self._first(ref, pos)
                second = right if first != right and rng.random() < self.second else self._other(rng, right)
                if second == first:
                    second = self._other(rng, first)
            else:  # under a wrong guess: whatever the target says there, these are other tokens
                first = self._other(rng, -1)
                second = self._other(rng, first)
            return [(first, self.acceptance), (second, (1 - self.acceptance) * self.second)], None

        def expand(level, tokens, parents):
            for i in level:
                paths[i] = paths[parents[i]] + (tokens[i],)
            return [guesses(paths[i]) for i in level]
            yield  # (a generator that never waits)

        d = run(grow(guesses(()), expand, floor, depth, max_nodes, stop))
        self._measure(0.0, len(d.tokens))
        self.confidence = d.sure
        return d
