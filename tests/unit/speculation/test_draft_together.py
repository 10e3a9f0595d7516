"""Conversations drafting at the same time draft together (peers/speculation/drafting/together.py): the shipped feature draft
on the real SmolLM2, three conversations at once give each what it drafts alone (chains, trees, sampled chains,
a stopped look-ahead), in fewer forwards; a cancelled request or a failing one leaves the others' drafts whole."""
import threading

import pytest
import torch
import trio
from transformers import AutoModelForCausalLM, AutoTokenizer

from peers.conversation.chat import render
from peers.speculation.drafting import FeatureDrafter, make_drafter
from peers.speculation.sampling import SamplingParams

pytestmark = pytest.mark.slow  # the real SmolLM2 and its shipped draft

PROMPTS = ["Explain quantum entanglement in simple terms.", "Write a haiku about autumn.",
           "List three uses of a binary search tree, with one sentence on each."]
GREEDY = SamplingParams(0.0, 0, 1.0, 0)


@pytest.fixture(scope="module")
def setup(smollm2):
    tok = AutoTokenizer.from_pretrained(smollm2)
    target = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    base = make_drafter(None, smollm2, target.config.vocab_size, tok)
    assert isinstance(base, FeatureDrafter) and base.together is not None
    contexts = []
    for p in PROMPTS:
        ids = render(tok, [{"role": "user", "content": p}])
        with torch.inference_mode():  # a pass's features: the target's final normalised hidden states
            feats = target.model(torch.tensor([ids])).last_hidden_state[0]
        contexts.append((ids, feats))
    return base, contexts


def forks(base, contexts):
    out = []
    for ids, feats in contexts:
        d = base.fork()
        d.observe(0, ids, feats)
        out.append(d)
    return out


def together(base, calls):
    """calls: (drafter, coroutine function) pairs, run at once; their results in order."""
    results = [None] * len(calls)

    async def main():
        async def one(i, d, fn):
            results[i] = await fn(d)
        async with trio.open_nursery() as n:
            for i, (d, fn) in enumerate(calls):
                n.start_soon(one, i, d, fn)
    trio.run(main)
    return results


def counting(base, monkeypatch) -> dict:
    """How many packed forwards and single ones (a conversation's step alone) the draft runs."""
    n = {"packed": 0, "alone": 0}
    many, single = base.together.forward_many, FeatureDrafter._run

    def packed(steps):
        n["packed"] += 1
        return many(steps)

    def alone(self, step):
        n["alone"] += 1
        return single(self, step)

    monkeypatch.setattr(base.together, "forward_many", packed)
    monkeypatch.setattr(FeatureDrafter, "_run", alone)
    return n


def test_drafting_together_is_one_forward_per_step_of_the_longest(setup, monkeypatch, caplog):
    """The shared run's forwards are as many as the longest draft's steps alone: the fallback that drafts each
    conversation alone (it logs) is not taken."""
    base, contexts = setup
    ctx = [ids for ids, _ in contexts]
    n = counting(base, monkeypatch)
    calls = [lambda d: d.draft(ctx[0], 7, GREEDY), lambda d: d.draft_tree(ctx[1], 0.005, 4, 12),
             lambda d: d.draft(ctx[2], 3, GREEDY)]
    steps = []
    for i, fn in enumerate(calls):
        n["alone"] = 0
        together(base, [(forks(base, contexts)[i], fn)])
        steps.append(n["alone"])
    n["packed"] = n["alone"] = 0
    with caplog.at_level("WARNING", logger="peers.drafting"):
        together(base, list(zip(forks(base, contexts), calls)))
    # one forward per step of the longest; packed while two or more drafts go on, the longest alone after
    assert n["packed"] + n["alone"] == max(steps) and n["packed"] == sorted(steps)[-2] < max(steps), (steps, n)
    assert not [r for r in caplog.records if "drafts this step alone" in r.getMessage()]


def test_chains_and_trees_drafted_together_equal_each_alone(setup):
    base, contexts = setup
    ctx = [ids for ids, _ in contexts]
    alone = forks(base, contexts)
    want = [alone[0].propose(ctx[0], 5, GREEDY, floor=0.0),
            alone[1].propose_tree(ctx[1], 0.005, 4, 12),
            alone[2].propose(ctx[2], 3, GREEDY, floor=0.0)]
    want_sure = [d.confidence for d in alone]
    runs = base.together.runs
    ds = forks(base, contexts)
    got = together(base, [(ds[0], lambda d: d.draft(ctx[0], 5, GREEDY)),
                          (ds[1], lambda d: d.draft_tree(ctx[1], 0.005, 4, 12)),
                          (ds[2], lambda d: d.draft(ctx[2], 3, GREEDY))])
    assert base.together.runs == runs + 1  # one run, its steps shared
    assert got[0][0] == want[0][0] and got[2][0] == want[2][0] and len(got[0][0]) == 5
    assert (got[1].tokens, got[1].parents) == (want[1].tokens, want[1].parents) and len(want[1].tokens) > 4
    for d, w in zip(ds, want_sure):
        assert d.confidence == pytest.approx(w, rel=1e-4)
    # the drafts' caches hold what drafting alone left: the next drafts agree too
    assert [d.propose(c, 4, GREEDY)[0] for d, c in zip(ds, ctx)] == [d.propose(c, 4, GREEDY)[0]
                                                                    for d, c in zip(alone, ctx)]


def test_sampled_drafts_together_draw_what_they_draw_alone(setup):
    base, contexts = setup
    ctx = [ids for ids, _ in contexts]
    params = [SamplingParams(0.8, 0, 1.0, seed) for seed in (1, 2, 3)]
    want = [d.propose(c, 4, p) for d, c, p in zip(forks(base, contexts), ctx, params)]
    ds = forks(base, contexts)
    got = together(base, [(d, lambda d, c=c, p=p: d.draft(c, 4, p)) for d, c, p in zip(ds, ctx, params)])
    for (gt, gq), (wt, wq) in zip(got, want):
        assert gt == wt
        torch.testing.assert_close(gq, wq, atol=1e-5, rtol=1e-4)


def test_a_stopped_look_ahead_ends_alone_and_the_others_go_on(setup):
    base, contexts = setup
    ctx = [ids for ids, _ in contexts]
    stop = threading.Event()
    stop.set()  # its reply came: it stops after its first draft
    ds = forks(base, contexts)
    got = together(base, [(ds[0], lambda d: d.draft(ctx[0], 6, GREEDY, stop)),
                          (ds[1], lambda d: d.draft(ctx[1], 6, GREEDY))])
    assert len(got[0][0]) == 1 and len(got[1][0]) == 6
    assert got[1][0] == forks(base, contexts)[1].propose(ctx[1], 6, GREEDY)[0]


def test_a_cancelled_or_failing_request_leaves_the_others_whole(setup):
    base, contexts = setup
    ctx = [ids for ids, _ in contexts]
    want = forks(base, contexts)[2].propose(ctx[2], 4, GREEDY)[0]
    ds = forks(base, contexts)
    results = {}

    async def main():
        async def drafting(name, coro):
            try:
                results[name] = await coro
            except Exception as e:
                results[name] = e
        async with trio.open_nursery() as n:
            with trio.CancelScope() as gone:
                gone.cancel()  # a client that went away before its turn
                await ds[0].draft(ctx[0], 4, GREEDY)
            n.start_soon(drafting, "unseen", ds[0].draft([7, 8], 4, GREEDY))  # no verified feature: no drafts
            n.start_soon(drafting, "wrong", ds[1].draft(wrong, 4, GREEDY))
            n.start_soon(drafting, "good", ds[2].draft(ctx[2], 4, GREEDY))
    wrong = ctx[1][:-1] + [10**9]  # an id the draft's embedding does not have, in the step packed with the others'
    ds[1].observe(0, wrong, contexts[1][1])
    runs = base.together.runs
    trio.run(main)
    assert base.together.runs == runs + 1
    assert results["good"][0] == want
    assert isinstance(results["wrong"], IndexError), results["wrong"]
    assert results["unseen"] == ([], None)
    ds[1].observe(0, ctx[1], contexts[1][1])  # the failed draft's cache starts again: it drafts as before
    assert ds[1].propose(ctx[1], 4, GREEDY)[0] == forks(base, contexts)[1].propose(ctx[1], 4, GREEDY)[0]
