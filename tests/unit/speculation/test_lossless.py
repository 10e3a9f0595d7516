"""Sampling through speculation is lossless: the first two emitted tokens follow the target's exact joint
distribution, measured over many seeded runs on a tiny model with a different tiny draft. A naive scheme
(accept the draft with probability p(x), ignoring q) is run beside it as a control and must fail the bound."""

import functools

import pytest
import torch
from transformers import AutoModelForCausalLM

from peers.speculation.sampling import SamplingParams, draw, position_generator, sample, verify_sampling

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


def _exact_two(p_of, prompt) -> dict:
    p1, exact = p_of(prompt), {}
    for a in torch.nonzero(p1).flatten().tolist():
        p2 = p_of(prompt + (a,))
        for b in torch.nonzero(p2).flatten().tolist():
            exact[(a, b)] = float(p1[a] * p2[b])
    return exact


def _run_seeded(p_of, q_of, prompt, seed):
    """What the rounds do: two drafts drawn from q with the target's uniform at their positions (none when q_of is
    None), verified by the target's own draw keyed by (seed, position), then a round with none: the first two."""
    at, drafts = len(prompt), []
    if q_of is not None:
        for i in range(2):
            drafts.append(draw(q_of(prompt + tuple(drafts)), position_generator(seed, at + i, stream=1)))
    p = torch.stack([p_of(prompt + tuple(drafts[:i])) for i in range(len(drafts) + 1)])
    n, nxt = verify_sampling(p, None, drafts, seed, at)
    out = drafts[:n] + [nxt]
    if len(out) < 2:
        out.append(sample(p_of(prompt + (out[0],)), seed, at + 1))
    return tuple(out[:2])


def test_seeded_rounds_keep_the_target_and_answer_as_with_no_draft(models):
    """The rounds' rule: distributed as the target, and for each seed the same answer as with no draft at all. The
    rejection rule with q (the control) is as exact, but its answer depends on the draft."""
    params = SamplingParams(1.0, top_k=5)
    target, draft = models
    p_of, q_of = _dist_fn(target, params), _dist_fn(draft, params)
    prompt = (1, 40, 41, 42, 43)
    counts, drafted_by_q = {}, 0
    for seed in range(N):
        out = _run_seeded(p_of, q_of, prompt, seed)
        assert out == _run_seeded(p_of, None, prompt, seed)
        counts[out] = counts.get(out, 0) + 1
        x = draw(q_of(prompt), position_generator(seed, len(prompt), stream=1))
        p = torch.stack([p_of(prompt), p_of(prompt + (x,))])
        n, nxt = verify_sampling(p, q_of(prompt)[None], [x], seed, len(prompt))
        drafted_by_q += ([x][:n] + [nxt])[0] != out[0]
    assert _tv(counts, _exact_two(p_of, prompt)) < BOUND
    assert drafted_by_q > N // 100  # with q the draft decides some answers: a seed would not repeat


# --- trees of sampled drafts ------------------------------------------------------------------------------------
# A tree's first two tokens, over a vocabulary of 6: the root has up to 3 children drawn without replacement from
# the draft's q, each of them up to 2 of its own. Target and draft are fixed random tables of the context (the
# draft sharper, and blind to one token), so the exact joint distribution is known; a chi-square bound over its
# cells (p = 1e-4) must hold for the real verifier and fail for subtly wrong ones.
V, TREE_N = 6, 12000


@functools.cache
def _table(ctx: tuple, salt: int, sharp: float, blind: int | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(hash((salt,) + ctx) % (2**31))
    logits = torch.randn(V, generator=g) * sharp
    if blind is not None:
        logits[blind] = float("-inf")
    return torch.softmax(logits, -1)


def _p(ctx):
    return _table(ctx, 1, 1.0)


def _q(ctx):
    return _table(ctx, 2, 2.0, blind=ctx[-1] % V)


def _tree(prompt, seed, deterministic):
    """(tokens, parents, q rows): the root's children, then each one's, drawn as the drafters draw them."""
    from peers.speculation.tree_sampling import sampled_children

    gen = torch.Generator().manual_seed(seed)
    tokens, parents, rows = [], [], []

    def kids(ctx, n):
        if deterministic:  # a lookup's continuations: fixed tokens of the context
            return [((ctx[-1] + 1 + j) % V, 0.0) for j in range(n)]
        return sampled_children(_q(ctx), n, gen)

    for t, _ in kids(prompt, 3):
        i = len(tokens)
        tokens.append(t), parents.append(-1), rows.append(_q(prompt))
        for u, _ in kids(prompt + (t,), 2):
            tokens.append(u), parents.append(i), rows.append(_q(prompt + (t,)))
    return tokens, parents, torch.stack(rows)


def _verify_tree_control(p, q, tokens, parents, seed, position, kind):
    """Wrong on purpose. "same q": without replacement but each sibling tested against the unchanged q;
    "no residual": p never reduced after a rejection."""
    g = torch.Generator().manual_seed(seed * 31 + position)
    path, node = [], -1
    while True:
        kids = [i for i, par in enumerate(parents) if par == node]
        pr = p[node + 1].double()
        qj = q[kids[0]].double() if kids else None
        nxt = None
        for c in kids:
            x = tokens[c]
            if torch.rand((), generator=g).item() < min(1.0, float(pr[x]) / float(qj[x])):
                nxt = c
                break
            if kind == "same q":
                pr = (pr - qj).clamp_min(0.0)
                pr = pr / pr.sum()
            else:
                qj = qj.clone()
                qj[x] = 0
                qj = qj / qj.sum()
        if nxt is None:
            return path, int(torch.multinomial(pr, 1, generator=g))
        path.append(nxt)
        node = nxt


def _chi_square(counts: dict, exact: dict, n: int) -> tuple[float, int]:
    assert set(counts) <= set(exact), "a pair the target can never produce"
    return sum((counts.get(k, 0) - n * e) ** 2 / (n * e) for k, e in exact.items()), len(exact) - 1


def _critical(df: int, z: float = 3.719) -> float:
    """The chi-square quantile at p = 1e-4 (Wilson-Hilferty)."""
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


def _tree_counts(verifier, deterministic):
    prompt = (3, 1, 4)
    counts = {}
    for seed in range(TREE_N):
        tokens, parents, q = _tree(prompt, seed, deterministic)
        rows = [_p(prompt)] + [_p(prompt + tuple(tokens[j] for j in _ancestry(parents, i)) + (tokens[i],))
                               for i in range(len(tokens))]
        path, nxt = verifier(torch.stack(rows), None if deterministic else q, tokens, parents, seed, len(prompt))
        out = [tokens[i] for i in path] + [nxt]
        if len(out) < 2:
            g = torch.Generator().manual_seed(seed + 10**6)
            out.append(int(torch.multinomial(_p(prompt + (out[0],)), 1, generator=g)))
        counts[tuple(out[:2])] = counts.get(tuple(out[:2]), 0) + 1
    exact = {(a, b): float(_p(prompt)[a] * _p(prompt + (a,))[b]) for a in range(V) for b in range(V)}
    return counts, exact


def _ancestry(parents, i):
    out, j = [], parents[i]
    while j >= 0:
        out.insert(0, j)
        j = parents[j]
    return out


@pytest.mark.parametrize("deterministic", [False, True], ids=["sampled drafts", "deterministic drafts"])
def test_a_sampled_tree_keeps_the_targets_distribution(deterministic):
    from peers.speculation.tree_sampling import verify_tree

    chi2, df = _chi_square(*_tree_counts(verify_tree, deterministic), TREE_N)
    assert chi2 < _critical(df), (chi2, df)


@pytest.mark.parametrize("kind", ["same q", "no residual"])
def test_a_subtly_wrong_tree_verifier_fails_the_bound(kind):
    def wrong(p, q, tokens, parents, seed, position):
        return _verify_tree_control(p, q, tokens, parents, seed, position, kind)

    chi2, df = _chi_square(*_tree_counts(wrong, False), TREE_N)
    assert chi2 > _critical(df), (chi2, df)
