"""A position's hidden state and logits are the same bits however the pass that computed it was made: alone or
among other positions, in a prefill cut anywhere, as a node of a tree or on top of a pass in flight, beside other
conversations. Under the CPU's defaults, bfloat16 activations and int4 weights (peers/compute/invariant.py), where
torch's own attention kernel rounds differently for each pass shape."""
import random

import pytest
import torch

from peers.base import tree_layout
from peers.compute import invariant
from peers.compute.shard import Shard, Span
from tiny import make_model, one


@pytest.fixture(scope="module", params=["llama", "sliding"])
def shard(request, tmp_path_factory):
    """A 4-layer model wide enough for int4 (rows of 32), in bfloat16 with int4 weights and an int8 head; the
    sliding one alternates windowed and full layers, its window shorter than the contexts below."""
    extra = dict(use_sliding_window=True, sliding_window=24, max_window_layers=2) if request.param == "sliding" else {}
    path = make_model(tmp_path_factory.mktemp(request.param), "qwen2" if request.param == "sliding" else "llama",
                      hidden=128, seed=3, max_position_embeddings=256, **extra)
    s = Shard(path, Span(0, 4, 4), embed=True, head=True, dtype="bfloat16", quant="int4")
    assert s.invariant
    return s


def tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(3, 250, (1, n), generator=torch.Generator().manual_seed(seed))


def alone(shard, ids: torch.Tensor, start: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Every position's hidden state and logits, the first `start` in one pass (a prefill's cuts change nothing:
    the first test), then each in a pass of its own."""
    s = shard.new_session()
    hs = [one(shard, s, 0, ids[:, :start])]
    hs += [one(shard, s, i, ids[:, i : i + 1]) for i in range(start, ids.shape[1])]
    h = torch.cat(hs, 1)
    return h, shard.logits(h)


@pytest.mark.parametrize("cuts", [[70], [8, 40, 1, 21], [8] + [5] * 12 + [2]])
def test_a_position_is_the_same_bits_alone_or_inside_any_pass(shard, cuts):
    ids = tokens(70, 1)
    want_h, want_logits = alone(shard, ids)
    s, at, hs = shard.new_session(), 0, []
    for n in cuts:
        hs.append(one(shard, s, at, ids[:, at : at + n]))
        at += n
    h = torch.cat(hs, 1)
    assert torch.equal(h, want_h)
    assert torch.equal(shard.logits(h), want_logits)


def random_tree(rng: random.Random, n: int) -> list[int]:
    """Parents of n nodes in depth-first order with the first child first (a main chain, then side branches)."""
    children: dict[int, list[int]] = {-1: []}
    for i in range(n):
        parent = rng.choice(list(children))
        children[parent].append(i)
        children[i] = []
    order, parents = [], []

    def walk(node: int, parent_at: int) -> None:
        for child in children[node]:
            order.append(child)
            parents.append(parent_at)
            walk(child, len(order) - 1)
    walk(-1, -1)
    return parents


@pytest.mark.parametrize("seed", range(2))
def test_every_tree_node_is_the_same_bits_as_its_path_alone(shard, seed):
    """A pass of 2 tokens the ring lacks and a random tree of 12 nodes: each node's logits are those of its own
    path computed one position at a time."""
    rng = random.Random(seed)
    context = tokens(40 + 7 * seed, seed)
    parents = random_tree(rng, 12)
    nodes = tokens(12, 100 + seed)
    s = shard.new_session()
    one(shard, s, 0, context[:, :-2])
    got = shard.logits(one(shard, s, context.shape[1] - 2, torch.cat([context[:, -2:], nodes], 1), parents))[0]
    full = tree_layout.full_parents(14, parents)
    for row in range(14):
        path, j = [], row
        while j >= 0:
            path.insert(0, j)
            j = full[j]
        ids = torch.cat([context[:, :-2], torch.cat([context[:, -2:], nodes], 1)[:, path]], 1)
        assert torch.equal(got[row], alone(shard, ids, context.shape[1] - 2)[1][0, -1]), (row, path)


def test_a_pass_built_on_one_in_flight_is_the_same_bits(shard):
    """Rounds in flight: a pass that keeps the columns of a pass not yet committed (here the second and third
    node of a chain sent before it) and adds a small tree of its own."""
    context, first = tokens(30, 7), tokens(4, 8)
    s = shard.new_session()
    one(shard, s, 0, context)
    one(shard, s, 30, first, [-1, 0, 1])  # 4 rows: a token the ring lacked and a chain of 3 drafts
    new = tokens(3, 9)
    # keep columns 30..32 (the token and two drafts), then two nodes under the last kept, one under the second
    h = shard.forward([(s, 30, new, [-1, 0, 1, 2, 2, 1], [30, 31, 32])])[0]
    got = shard.logits(h)[0]
    kept = first[:, :3]
    want = [alone(shard, torch.cat([context, kept, new[:, :1]], 1), 30)[1][0, -1],
            alone(shard, torch.cat([context, kept, new[:, 1:2]], 1), 30)[1][0, -1],
            alone(shard, torch.cat([context, kept[:, :2], new[:, 2:3]], 1), 30)[1][0, -1]]
    for row in range(3):
        assert torch.equal(got[row], want[row]), row


def test_conversations_sharing_a_pass_are_the_same_bits_as_each_alone(shard):
    a, b, c = tokens(60, 11), tokens(45, 12), tokens(20, 13)
    caches = [shard.new_session() for _ in range(3)]
    for cache, ids in zip(caches, (a, b, c)):
        one(shard, cache, 0, ids[:, :-5])
    shared = shard.forward([(caches[0], 55, a[:, 55:], []), (caches[1], 40, b[:, 40:41], []),
                            (caches[2], 15, c[:, 15:], [-1, 0, 0, 2])])
    for h, ids, n in zip(shared, (a, b, c), (5, 1, 5)):
        s = shard.new_session()
        one(shard, s, 0, ids[:, :-5])
        own = one(shard, s, ids.shape[1] - 5, ids[:, -5:][:, :n], [] if n == 1 or ids is not c else [-1, 0, 0, 2])
        assert torch.equal(h, own)


def test_groups_follow_each_root_to_leaf_path():
    # columns: 0 1 2 on the main chain, 3 under 0, 4 under 3, 5 under the root
    g = invariant.groups(10, 0, [-1, 0, 1, 0, 3, -1])
    assert [(x.rows, x.positions, x.width, x.dst, x.src) for x in g] == [
        ([0, 1, 2], [10, 11, 12], 13, 0, ()),
        ([3, 4], [11, 12], 13, 11, (13, 14)),
        ([5], [10], 11, 10, (15,)),
    ]
    # two kept columns (no queries) lead the chain
    assert [(x.rows, x.positions) for x in invariant.groups(10, 2, [-1, 0, 1, 1])] == [([0], [12]), ([1], [12])]
