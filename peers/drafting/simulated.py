"""A drafter of known acceptance, for `sfchat bench` only: speculation measured where no real draft's acceptance
is known (random weights, say), every pass, hop and verification being real.

It proposes the target's own greedy continuation (recorded from a plain run of the same prompt at temperature 0)
and replaces each drafted token with another, with probability 1 - A, drawn from a generator seeded by the
position: a token proposed twice (drafted ahead, then again) is the same token. Greedy rounds only.
"""
from __future__ import annotations

import random

from .base import Drafter
from .choose import SIMULATED


def parse_simulated(spec: str | None) -> list[float] | None:
    """The acceptances of `simulated:A[,A…]`, or None for any other spec; a bad A is a one-line ValueError."""
    if not spec or not spec.startswith(SIMULATED):
        return None
    out = []
    for text in spec[len(SIMULATED):].split(","):
        try:
            a = float(text)
        except ValueError:
            a = -1.0
        if not 0.0 <= a <= 1.0:
            raise ValueError(f"--draft {spec}: a simulated acceptance is a number in 0..1")
        out.append(a)
    return out


class SimulatedDrafter(Drafter):
    def __init__(self, acceptance: float, vocab: int, references: list[list[int]] = (), seed: int = 0):
        self.acceptance, self.vocab, self.seed = acceptance, vocab, seed
        self.references = [list(r) for r in references]  # each a prompt and its greedy continuation
        self.name = f"simulated acceptance {acceptance:g}"

    def propose(self, context, n, params, stop=None, floor=0.0, prior=1.0):
        if not params.greedy:
            raise ValueError("a simulated draft proposes the greedy continuation: it needs temperature 0")
        ref = next((i for i, r in enumerate(self.references) if len(r) > len(context)
                    and r[:len(context)] == context), None)
        if ref is None:  # past what the plain run made, or another prompt
            return [], None
        out = []
        for pos in range(len(context), min(len(context) + n, len(self.references[ref]))):
            tok, rng = self.references[ref][pos], random.Random(f"{self.seed}:{ref}:{pos}")
            if rng.random() >= self.acceptance:
                tok = (tok + 1 + rng.randrange(self.vocab - 1)) % self.vocab  # any token but the right one
            out.append(tok)
        self._measure(0.0, len(out))
        return out, None
