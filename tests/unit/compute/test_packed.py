"""Several conversations in one pass (peers/compute/packed.py): for every architecture, a packed pass gives each
conversation what its own pass gives it, through prefills of different lengths, chains and trees of drafts,
rollbacks and sliding windows; and greedy answers generated in packed rounds equal plain transformers'."""
import pytest
import torch

from peers.compute.shard import Shard, Span
from tiny import ARCHS, make_model, one
from test_static_cache import greedy
from peers.speculation.tree import on_chain, verify_greedy

PROMPTS = [[5, 17, 42, 99, 7, 3, 120, 64, 11], [250, 33, 8], [19, 140, 77, 2, 91, 60, 45, 23, 200, 13, 9, 31, 4]]
# each round, per conversation: (committed rollback, the pass's ids, tree parents or None)
ROUNDS = [
    [(None, [1], None), (None, [2, 3, 4], None), (None, [5, 6, 7, 8], [-1, -1, 0, 1])],
    [(-1, [9, 10], None), (-2, [11], None), (0, [12, 13, 14, 15, 16], None)],
]


@pytest.mark.parametrize("arch", list(ARCHS))
def test_a_packed_pass_gives_each_conversation_its_own_pass(arch, tmp_path):
    model = make_model(tmp_path / arch, arch, layers=2, seed=7)
    shard = Shard(model, Span(0, 2, 2), embed=True, head=True, conversations=6)
    alone = [shard.new_session() for _ in PROMPTS]
    together = [shard.new_session() for _ in PROMPTS]
    held = [len(p) for p in PROMPTS]
    for s, t, p in zip(alone, together, PROMPTS):
        one(shard, s, 0, torch.tensor([p]))
        one(shard, t, 0, torch.tensor([p]))
    for rnd in ROUNDS:
        items = []
        for i, (back, ids, parents) in enumerate(rnd):
            committed = held[i] + (back or 0)
            items.append((committed, torch.tensor([ids]), parents))
            held[i] = committed + len(ids)
        want = [one(shard, s, c, x, p) for s, (c, x, p) in zip(alone, items)]
        got = shard.forward([(s, c, x, p) for s, (c, x, p) in zip(together, items)])
        for w, g in zip(want, got):
            assert g.shape == w.shape
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
        assert [s.length for s in together] == [s.length for s in alone] == held


def test_a_packed_pass_runs_each_layer_once_over_every_conversation(tiny_llama):
    """Packing is one call of each layer over all conversations' positions, not a loop of passes."""
    shard = Shard(tiny_llama, Span(0, 4, 4), embed=True, head=True)
    calls = []
    shard.layers[0].register_forward_pre_hook(lambda m, args, kw: calls.append(kw["hidden_states"].shape
                                                                               if "hidden_states" in kw else
                                                                               args[0].shape), with_kwargs=True)
    sessions = [shard.new_session() for _ in PROMPTS]
    shard.forward([(s, 0, torch.tensor([p]), None) for s, p in zip(sessions, PROMPTS)])
    assert len(calls) == 1 and calls[0][:2] == (1, sum(len(p) for p in PROMPTS))


@pytest.mark.parametrize("arch", ["llama", "gemma2", "qwen2"])
@pytest.mark.parametrize("padded", [False, True])
def test_greedy_answers_in_packed_rounds_equal_transformers(arch, padded, tmp_path):
    """Three different prompts at different speeds (K of 0, 2 and 5 drafts a round, half of them wrong): each
    answer is transformers' greedy answer to its own prompt (a leak between conversations would show)."""
    model = make_model(tmp_path / arch, arch, layers=3, seed=8)
    wants = [greedy(model, 12, p) for p in PROMPTS]
    shard = Shard(model, Span(0, 3, 3), embed=True, head=True, padded=padded)
    ks = [0, 2, 5]
    sessions = [shard.new_session() for _ in ks]
    tokens = [list(p) for p in PROMPTS]
    held = [0 for _ in ks]
    while any(len(t) < len(p) + len(w) for t, p, w in zip(tokens, PROMPTS, wants)):
        items, drafts = [], []
        for i, k in enumerate(ks):
            done = len(tokens[i]) - len(PROMPTS[i])
            truth = wants[i][done:] + [0] * k
            d = [t if j % 2 == 0 else (t + 1) % 300 for j, t in enumerate(truth[:k])]
            drafts.append(d)
            items.append((sessions[i], held[i], torch.tensor([tokens[i][held[i]:] + d]), None))
        outs = shard.forward(items)
        for i, (h, d) in enumerate(zip(outs, drafts)):
            logits = shard.logits(h)[0, -(len(d) + 1):]
            path, nxt = verify_greedy(logits.argmax(-1).tolist(), d, list(range(-1, len(d) - 1)))
            held[i] = len(tokens[i]) + on_chain(path)
            tokens[i] += [d[p] for p in path] + [nxt]
    for t, p, w in zip(tokens, PROMPTS, wants):
        assert t[len(p):len(p) + len(w)] == w
    if padded:  # the rounds went as batches of 3 conversations padded to 4 rows
        assert {b for b, _ in shard.graphs.padded} == {4}
