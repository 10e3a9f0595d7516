"""The target's log-probabilities at each committed position, for an API's `logprobs` and `top_logprobs`.

They are of the model's raw distribution, log_softmax of the target's logits before temperature, top-k and
top-p, as OpenAI and vLLM report them by default. The rows are the verifier's own: the pass that decided a token
also carried the target's logits at its position, so they are the same with or without drafts, trees or rounds
in flight.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_TOP = 20  # OpenAI's limit on top_logprobs


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # the `n` likeliest tokens there, likeliest first


def token_logprobs(rows: torch.Tensor, tokens: list[int], top: int) -> list[TokenLogprob]:
    """rows [N, V]: the target's logits at the positions of `tokens` (N of them)."""
    lp = torch.log_softmax(rows.detach().float().cpu(), dim=-1)
    chosen = lp.gather(1, torch.tensor(tokens).view(-1, 1)).view(-1).tolist()
    if top:
        vals, ids = lp.topk(top, dim=-1)
        tops = [tuple(zip(i, v)) for i, v in zip(ids.tolist(), vals.tolist())]
    else:
        tops = [()] * len(tokens)
    return [TokenLogprob(t, c, tp) for t, c, tp in zip(tokens, chosen, tops)]
