import pytest

from peers.plan import split_layers


def test_proportional_and_contiguous():
    spans = split_layers(30, [1.0, 1.0, 2.0])
    # 7.5, 7.5, 15: the tied half layer goes to the earlier member
    assert [(s.start, s.end) for s in spans] == [(0, 8), (8, 15), (15, 30)]
    assert spans[0].start == 0 and spans[-1].end == 30
    assert all(a.end == b.start for a, b in zip(spans, spans[1:]))


@pytest.mark.parametrize("n,offers", [(30, [5, 0, 5]), (4, [1, 1, 1, 1, 1, 1]), (28, [16e9, 15e9]), (1, [3, 1])])
def test_every_layer_assigned_once(n, offers):
    spans = split_layers(n, offers)
    assert sum(s.size for s in spans) == n
    assert [s.start for s in spans] == sorted(s.start for s in spans)
    for s, o in zip(spans, offers):
        if o == 0:
            assert s.size == 0


def test_nothing_offered_splits_evenly():
    assert [s.size for s in split_layers(6, [0, 0, 0])] == [2, 2, 2]
