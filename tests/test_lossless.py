"""Sampling through speculation is lossless: the first two emitted tokens follow the target's exact joint
distribution, measured over many seeded runs on a tiny model with a different tiny draft. A naive scheme
(accept the draft with probability p(x), ignoring q) is run beside it as a control and must fail the bound."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from peers.sampling import SamplingParams, verify_sampling

N = 20000
BOUND = 0.03  # total variation; the sampling noise at N draws over <= 64 outcomes is about 0.01-0.015


@pytest.fixture(scope="module")
def models(tiny_llama):
    target = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    with torch.no_grad():  # a related but overconfident draft: same ranking, sharper probabilities
        draft.model.norm.weight.mul_(2.0)
    return target, draft


def _dist_fn(model, params):
    cache = {}

    @torch.no_grad()
    def dist(ctx: tuple) -> torch.Tensor:
        if ctx not in cache:
            cache[ctx] = params.probs(model(torch.tensor([list(ctx)])).logits[0, -1:])[0]
        return cache[ctx]
    return dist


def _run(p_of, q_of, prompt, seed, scheme):
    """Two drafts, then (if needed) a second round with none: the first two tokens emitted."""
    g = torch.Generator().manual_seed(seed * 7919 + 1)
    x1 = int(torch.multinomial(q_of(prompt), 1, generator=g))
    x2 = int(torch.multinomial(q_of(prompt + (x1,)), 1, generator=g))
    p = torch.stack([p_of(prompt), p_of(prompt + (x1,)), p_of(prompt + (x1, x2))])
    q = torch.stack([q_of(prompt), q_of(prompt + (x1,))])
    if scheme == "rejection":
        n, nxt = verify_sampling(p, q, [x1, x2], seed, len(prompt))
    else:  # the control: accept x with probability p(x), else resample from p -- ignores q, so biased
        n, nxt = 2, None
        for i, x in enumerate([x1, x2]):
            if torch.rand((), generator=g).item() >= float(p[i, x]):
                n, nxt = i, int(torch.multinomial(p[i], 1, generator=g))
                break
        if nxt is None:
            nxt = int(torch.multinomial(p[2], 1, generator=g))
    out = [x1, x2][:n] + [nxt]
    if len(out) < 2:
        out.append(int(torch.multinomial(p_of(prompt + (out[0],)), 1, generator=g)))
    return tuple(out[:2])


def _tv(counts: dict, exact: dict) -> float:
    keys = set(counts) | set(exact)
    return 0.5 * sum(abs(counts.get(k, 0) / N - exact.get(k, 0.0)) for k in keys)


@pytest.mark.parametrize("params", [SamplingParams(1.0, top_k=5), SamplingParams(0.8, top_p=0.9, top_k=8)])
def test_rejection_sampling_matches_the_target_and_the_naive_scheme_does_not(models, params):
    target, draft = models
    p_of, q_of = _dist_fn(target, params), _dist_fn(draft, params)
    prompt = (1, 40, 41, 42, 43)
    p1 = p_of(prompt)
    exact = {}
    for a in torch.nonzero(p1).flatten().tolist():
        p2 = p_of(prompt + (a,))
        for b in torch.nonzero(p2).flatten().tolist():
            exact[(a, b)] = float(p1[a] * p2[b])
    results = {}
    for scheme in ("rejection", "naive"):
        counts = {}
        for seed in range(N):
            k = _run(p_of, q_of, prompt, seed, scheme)
            counts[k] = counts.get(k, 0) + 1
        results[scheme] = _tv(counts, exact)
    print(params, results)
    assert results["rejection"] < BOUND, results
    assert results["naive"] > BOUND, results
