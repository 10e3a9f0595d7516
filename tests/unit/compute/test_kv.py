"""The KV arena and a pass's mask (peers/compute/kv.py), alone: rows taken and given back, the idlest conversation
evicted when the arena is full, keep checked, and the mask a tree pass attends by."""
import gc

import pytest
import torch

from peers.compute.kv import Arena, ArenaWriter, RoomError, SessionCache, check_keep, meta, unpack, visible


def arena(rows=2):
    return Arena(layers=1, rows=rows, kv_heads=1, head_dim=2, room=8, dtype=torch.float32,
                 device=torch.device("cpu"), zeroed=True)


def test_rows_are_taken_evicted_by_idleness_and_given_back():
    a = arena(rows=2)
    s1, s2, s3 = SessionCache(last_used=1.0), SessionCache(last_used=2.0), SessionCache(last_used=3.0)
    a.place([s1, s2])
    assert {s1.row, s2.row} == {0, 1}
    s1.length = 5
    a.place([s3])  # full: s1, idle longest, loses its row and its positions
    assert s3.row == 0 and s1.row is None and s1.evicted and s1.length == 0
    with pytest.raises(RoomError, match="holds 2 conversations"):
        a.place([s1, s2, s3])  # none of these may be evicted for another
    del s2
    gc.collect()  # a conversation that ends gives its row back
    a.place([s1])
    assert s1.row == 1 and not s1.evicted


def test_the_writer_puts_keys_at_their_row_and_columns():
    a = arena(rows=2)
    w = ArenaWriter(a, 0, rows=torch.tensor([1]), columns=torch.tensor([[3, 4]]))
    k = torch.arange(4.0).view(1, 1, 2, 2)  # [B, kv_heads, T, head_dim]
    keys, _ = w.update(k, -k, 0)
    assert torch.equal(a.keys[0, 1, 0, 3:5], k[0, 0]) and torch.equal(a.values[0, 1, 0, 3:5], -k[0, 0])
    assert a.keys[0, 0].abs().sum() == 0 and keys.shape == (1, 1, 8, 2)  # row 0 untouched; row 1's whole room


def test_keep_must_name_uncommitted_columns_in_order():
    check_keep(None, 3, 6)
    check_keep([3, 5], 3, 6)
    for bad, says in (([5, 4], "ascending"), ([2], "uncommitted"), ([6], "uncommitted"), ("3", "list")):
        with pytest.raises(ValueError, match=says):
            check_keep(bad, 3, 6)


def test_a_tree_pass_sees_the_prefix_and_its_own_ancestors_only():
    # committed 2 positions; a pass of 3 rows: row 0 the root, rows 1 and 2 both its children (siblings)
    committed, pos, sees = unpack(meta(2, 3, [-1, 0, 0], 4)[None], 4)
    assert pos[0].tolist() == [2, 3, 3, 3]  # siblings share a position; the padding row sits at the last one
    mask = visible(committed, pos, sees, 0, 6, window=None)[0, 0]
    assert mask[:3].int().tolist() == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 1, 0]]
    windowed = visible(committed, pos, sees, 0, 6, window=2)[0, 0]
    assert windowed[1].int().tolist() == [0, 0, 1, 1, 0, 0]  # position 3 sees back to position 2 only
