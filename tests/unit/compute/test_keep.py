"""A pass that builds on positions of a pass still in flight (`keep`, peers/compute/shard.py): the kept columns move after
the committed ones and the new rows attend to them as their tree says, so each row's hidden state is the one an
ordinary pass over the conversation up to that row gives; a bad keep is one line and moves nothing; `skip` lays
the columns out as a computed pass would."""
import pytest
import torch

from peers.compute.shard import Shard, Span
from tiny import make_model, one

PROMPT = [5, 17, 42, 99, 7, 3, 120, 64, 11]
# a round's pass after the prompt: the root token, then a tree of drafts under it (short form: -1 is the root);
# cache columns 9 (root), 10..15 (nodes 0..5)
ROUND = [30, 31, 32, 33, 34, 35, 36]
TREE = [-1, 0, -1, 2, 3, 2]


def tokens_to(full: list[int], ids: list[int], i: int) -> list[int]:
    """The tokens from the first uncommitted row down to row i of a full tree."""
    out = []
    while i >= 0:
        out.insert(0, ids[i])
        i = full[i]
    return out


def ordinary(shard, ids: list[int]) -> torch.Tensor:
    """The hidden state at the last of `ids`, from a fresh cache fed them in one ordinary pass."""
    return one(shard, shard.new_session(), 0, torch.tensor([ids]))[0, -1]


@pytest.fixture(scope="module", params=["llama", "mistral", "gemma2"])
def shard(request, tmp_path_factory):
    """llama; mistral: every layer a sliding window of 4; gemma2: windowed and global layers in turn."""
    model = make_model(tmp_path_factory.mktemp(request.param), request.param, layers=2, seed=11)
    return Shard(model, Span(0, 2, 2), embed=True, head=True, conversations=8)


def after_round(shard):
    s = shard.new_session()
    one(shard, s, 0, torch.tensor([PROMPT]))
    one(shard, s, len(PROMPT), torch.tensor([ROUND]), TREE)
    return s


def check_rows(shard, got, kept_ids, new_ids, full):
    ids = kept_ids + new_ids
    for r in range(len(new_ids)):
        want = ordinary(shard, PROMPT + tokens_to(full, ids, len(kept_ids) + r))
        torch.testing.assert_close(got[0, r], want, atol=1e-5, rtol=1e-5)


def test_keep_an_accepted_path_off_the_main_chain(shard):
    """The round accepted root, node 2, node 3 (columns 9, 12, 13: off the main chain); the next pass keeps them
    and adds a tree under node 3. Each new row, and a plain pass after, equals an ordinary pass."""
    s = after_round(shard)
    keep, kept_ids = [9, 12, 13], [30, 33, 34]
    new_ids, full = [40, 41, 42], [-1, 0, 1, 2, 3, 2]  # 40 and 42 under node 3, 41 under 40
    got = shard.forward([(s, len(PROMPT), torch.tensor([new_ids]), full, keep)])[0]
    assert s.length == len(PROMPT) + 3 + 3
    check_rows(shard, got, kept_ids, new_ids, full)
    # the path root, 2, 3, 40, 41 is committed: a plain pass goes on from it
    after = one(shard, s, len(PROMPT) + 5, torch.tensor([[50]]))[0, -1]
    torch.testing.assert_close(after, ordinary(shard, PROMPT + kept_ids + [40, 41, 50]), atol=1e-5, rtol=1e-5)


def test_keep_nodes_still_in_flight_on_two_branches(shard):
    """Nothing of the round is committed yet: the next pass keeps root, node 0 and nodes 2, 3 (two branches) and
    hangs new rows under node 0 and under node 3."""
    s = after_round(shard)
    keep, kept_ids = [9, 10, 12, 13], [30, 31, 33, 34]
    new_ids, full = [60, 61, 62], [-1, 0, 0, 2, 1, 3, 4]  # 60 under node 0, 61 under node 3, 62 under 60
    got = shard.forward([(s, len(PROMPT), torch.tensor([new_ids]), full, keep)])[0]
    check_rows(shard, got, kept_ids, new_ids, full)


@pytest.mark.parametrize("keep", [[12, 10], [8, 10], [10, 16], [10, 10]],
                         ids=["descending", "below-committed", "past-length", "repeated"])
def test_a_bad_keep_is_one_line_and_moves_nothing(shard, keep):
    s = after_round(shard)
    before = shard.arena.keys[:, s.row].clone()
    with pytest.raises(ValueError) as e:
        shard.forward([(s, len(PROMPT), torch.tensor([[70]]), [-1] * (len(keep) + 1), keep)])
    assert "\n" not in str(e.value) and "keep" in str(e.value)
    assert s.length == len(PROMPT) + len(ROUND) and torch.equal(shard.arena.keys[:, s.row], before)
    # the conversation goes on as if the bad pass had never come
    got = one(shard, s, len(PROMPT) + 1, torch.tensor([[70]]))[0, -1]
    torch.testing.assert_close(got, ordinary(shard, PROMPT + [30, 70]), atol=1e-5, rtol=1e-5)


def test_packed_passes_with_and_without_keep(shard):
    """Three conversations in one pass: one keeps an off-chain path, one keeps in-flight branches, one is a plain
    round; each gets what it gets alone."""
    a, b, c = after_round(shard), after_round(shard), after_round(shard)
    items = [(a, 9, torch.tensor([[40, 41]]), [-1, 0, 1, 2, 3], [9, 12, 13]),
             (b, 9, torch.tensor([[60, 61, 62]]), [-1, 0, 0, 2, 1, 3, 4], [9, 10, 12, 13]),
             (c, 11, torch.tensor([[80, 81, 82]]), [-1, -1])]  # 81 and 82 under 80
    got = shard.forward(items)
    check_rows(shard, got[0], [30, 33, 34], [40, 41], [-1, 0, 1, 2, 3])
    check_rows(shard, got[1], [30, 31, 33, 34], [60, 61, 62], [-1, 0, 0, 2, 1, 3, 4])
    for r, path in enumerate([[80], [80, 81], [80, 82]]):
        torch.testing.assert_close(got[2][0, r], ordinary(shard, PROMPT + [30, 31] + path), atol=1e-5, rtol=1e-5)
    assert [s.length for s in (a, b, c)] == [9 + 5, 9 + 7, 11 + 3]


def test_a_skipped_pass_lays_the_columns_out_as_a_computed_one(shard):
    """skip keeps what forward would keep and where: a pass after it that keeps the moved columns (never the
    skipped ones) is exact."""
    s = after_round(shard)
    shard.skip(s, len(PROMPT), [9, 12, 13], 4)
    assert s.length == len(PROMPT) + 3 + 4
    got = shard.forward([(s, len(PROMPT), torch.tensor([[40]]), [-1, 0, 1, 2], [9, 10, 11])])[0]
    torch.testing.assert_close(got[0, 0], ordinary(shard, PROMPT + [30, 33, 34, 40]), atol=1e-5, rtol=1e-5)


def test_passes_with_keep_run_eagerly_where_graphs_pad(tiny_llama):
    """The padded path (what CUDA graphs replay) leaves a batch with any keep to the eager path, exactly."""
    shard = Shard(tiny_llama, Span(0, 4, 4), embed=True, head=True, padded=True)
    s = after_round(shard)
    got = shard.forward([(s, 9, torch.tensor([[40]]), [-1, 0, 1, 2], [9, 12, 13])])[0]
    torch.testing.assert_close(got[0, 0], ordinary(shard, PROMPT + [30, 33, 34, 40]), atol=1e-5, rtol=1e-5)
