"""From logits to tokens: the target's distribution p, the draft's q, and the verification rules.

Greedy: accept the longest prefix of drafts equal to the target's argmax, then the target's own next token
(peers/speculation/tree.py: a chain is a tree with one child per node).
Sampling (lossless speculative rejection sampling, Leviathan et al. / Chen et al.):
  accept draft x_i with probability min(1, p_i(x_i) / q_i(x_i));
  at the first rejection draw from normalize(max(0, p_i - q_i));
  if all K are accepted draw a bonus token from p_K.
The emitted tokens are then distributed exactly as sampling from p alone. A deterministic draft has q one-hot.

Seeds that repeat. The rounds use the deterministic form, whatever the draft (q None below): at each position the
target draws its own token y from p by inverse CDF over one uniform keyed by (seed, position), and a draft is
accepted iff it equals y; at the first that does not, y is the token. Each y is distributed as p given the prefix
(the uniforms of different positions are independent), so the answer is exactly p's, and it is a function of the
seed and the prompt alone: the same with or without drafts, trees or rounds in flight, after any other request,
on any ring. A sampled draft draws with the same uniform (stream 1) from its own q, so where q is near p it drafts
the token the target will draw. The rejection rule with q stays here, tested, for the record of what it costs:
its acceptance sum(min(p, q)) is higher, but its answer depends on the draft's q, so a seed could not repeat.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    logprobs: int | None = None  # None: none; n: each committed token's log-probability and the n likeliest there
    grammar: object | None = None  # an answer's peers.speculation.grammar.Grammar: what every token must follow

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError("temperature must be >= 0, top-p in (0, 1], top-k >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def warpers(self) -> LogitsProcessorList:
        w = LogitsProcessorList([TemperatureLogitsWarper(self.temperature)])
        if self.top_k:
            w.append(TopKLogitsWarper(self.top_k))
        if self.top_p < 1:
            w.append(TopPLogitsWarper(self.top_p))
        return w

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Rows of logits [N, V] -> rows of probabilities after temperature, top-k and top-p."""
        return torch.softmax(self.warpers()(None, logits.float()), dim=-1)



def position_generator(seed: int | None, position: int, stream: int) -> torch.Generator:
    """Randomness tied to (seed, position, stream): 0 drafts, 1 verifies, 2 resamples after a rejection.
    Same seed, same history, same output."""
    g = torch.Generator()
    g.manual_seed(((seed or 0) * 1_000_003 + position * 4 + stream) % (2**63))
    return g


def pad_vocab(q: torch.Tensor, vocab: int) -> torch.Tensor:
    """A draft with fewer vocabulary rows than the target gives the missing ids probability 0."""
    if q.shape[-1] == vocab:
        return q
    if q.shape[-1] > vocab:
        return q[..., :vocab] / q[..., :vocab].sum(-1, keepdim=True)
    return torch.nn.functional.pad(q, (0, vocab - q.shape[-1]))


def draw(p: torch.Tensor, gen: torch.Generator) -> int:
    """One id from the (unnormalised) distribution p by inverse CDF: a cumulative sum and a binary search over
    one uniform, ten times cheaper than torch.multinomial on a 50k vocabulary here."""
    u = torch.rand((), generator=gen, dtype=torch.float64)
    cdf = p.double().cumsum(0)
    return min(int(torch.searchsorted(cdf, u * cdf[-1], right=True)), p.shape[0] - 1)


def sample(p: torch.Tensor, seed: int, position: int) -> int:
    """The target's own draw at `position`: the same token whoever drafted, and however K was chosen."""
    return draw(p, position_generator(seed, position, stream=1))


def verify_sampling(p: torch.Tensor, q: torch.Tensor | None, drafts: list[int], seed: int, position: int
                    ) -> tuple[int, int]:
    """p [K+1, V] target probabilities for positions position.., q [K, V] draft probabilities.

    q None means a deterministic draft (q one-hot at x). Then the rule reduces to: accept x with probability
    p(x), else draw from p with x removed -- which is exactly "draw y from p, accept iff y == x, emit y". We use
    that form with per-position randomness, so a seeded answer is the same whatever the drafter or K.
    """
    for i, x in enumerate(drafts):
        if q is None:
            y = sample(p[i], seed, position + i)
            if y == x:
                continue
            return i, y
        qx, px = float(q[i, x]), float(p[i, x])
        u = torch.rand((), generator=position_generator(seed, position + i, stream=1)).item()
        if qx > 0 and u < min(1.0, px / qx):  # q <= p: always accept; q > p: accept with probability p/q
            continue
        residual = (p[i] - q[i]).clamp_min(0.0)
        if residual.sum() <= 0:  # p == q: a rejection had probability 0, p itself is the answer
            residual = p[i]
        return i, draw(residual, position_generator(seed, position + i, stream=2))
    return len(drafts), sample(p[len(drafts)], seed, position + len(drafts))
