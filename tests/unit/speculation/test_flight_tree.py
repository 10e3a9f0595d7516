"""The tree rounds in flight share (peers/speculation/flight_tree.py), without a ring: where a draft's nodes go in
the caches, what a frame keeps, how verdicts commit and kill, and where the next hedge would go."""
from peers.speculation.flight_tree import Tree
from peers.speculation.sampling import SamplingParams
from peers.speculation.tree import Draft

GREEDY = SamplingParams()


def chain(tokens: list[int], sure: list[float]) -> Draft:
    return Draft(tokens, list(range(-1, len(tokens) - 1)), sure)


def test_a_round_is_laid_out_after_the_committed_positions_and_the_committed_lead_joins_them():
    t = Tree([5, 6, 7], base=2)  # the ring holds 5 and 6; 7 is the head, not sent yet
    [seven] = t.unsent()
    eight, nine = (n for _, n in t.graft(t.head, 1.0, chain([8, 9], [0.9, 0.5]), greedy=True))
    at = t.lay_out([seven, eight, nine])
    assert (at.parents, at.keep, at.committed) == ([-1, 0, 1], [], 2)
    assert [n.col for n in (seven, eight, nine)] == [2, 3, 4]
    assert t.base == 3 and t.cols == [eight, nine]  # 7 is committed: it joins the row


def test_a_verdict_commits_down_the_tree_and_the_next_frame_keeps_only_what_lives():
    t = Tree([5, 6, 7], base=2)
    [seven] = t.unsent()
    eight, nine = (n for _, n in t.graft(t.head, 1.0, chain([8, 9], [0.9, 0.5]), greedy=True))
    t.lay_out([seven, eight, nine])
    seven.best, eight.best = 8, 4  # the target takes 8, then 4 where the draft said 9
    new, at_eos, _ = t.walk(10, GREEDY, eos={2})
    assert new == [8, 4] and not at_eos and nine.dead and eight.committed and t.head.token == 4
    [four] = t.unsent()  # the target's own token: the next round carries it
    at = t.lay_out([four])
    assert (at.parents, at.keep, at.committed) == ([-1, 0], [3], 3)  # 8 kept in its column, 9 dropped
    assert t.base == 5 and t.cols == []


def test_a_walk_stops_where_no_verdict_is_back_and_at_the_end_of_the_answer():
    t = Tree([5, 6, 7], base=2)
    [seven] = t.unsent()
    eight, nine = (n for _, n in t.graft(t.head, 1.0, chain([8, 2], [0.9, 0.8]), greedy=True))
    t.lay_out([seven, eight, nine])
    seven.best = 8  # 8's own verdict is not back
    assert t.walk(10, GREEDY, eos={2})[:2] == ([8], False)
    eight.best = 2
    assert t.walk(10, GREEDY, eos={2})[:2] == ([2], True)
    assert t.walk(10, GREEDY, eos={2})[0] == []


def test_the_likeliest_stops_are_where_hedges_go_and_a_known_token_is_grafted_once():
    t = Tree([5, 6, 7], base=2)
    t.graft(t.head, 1.0, chain([8, 9], [0.9, 0.45]), greedy=True)
    stops = t.ends(floor=0.0, greedy=True)  # stopping at 8: 0.9 - 0.45; at 9: 0.45; at 7: 0.1
    assert [(round(c, 2), n.token) for c, n in stops] == [(0.9, 8), (0.45, 9)]
    again = t.graft(t.head, 1.0, Draft([8, 3], [-1, 0], [0.9, 0.3]), greedy=True)
    assert [n.token for _, n in again] == [3]  # 8 is the child it was; 3 goes beside 9
    assert [c.token for c in t.head.children[0].children] == [9, 3] and t.below(t.head) == 3
    assert t.path(again[0][1], t.head) == [8, 3] and t.child_of(again[0][1], t.head) is t.head.children[0]


def test_a_sampled_nodes_children_are_drawn_once():
    t = Tree([5, 6, 7], base=2)
    [seven] = t.unsent()
    made = t.graft(t.head, 1.0, chain([8], [0.6]), greedy=False)
    t.lay_out([seven] + [n for _, n in made])
    assert t.graft(t.head, 1.0, chain([4], [0.3]), greedy=False) == []  # 7's children went out already
    assert t.ends(floor=0.0, greedy=False)[0][1].token == 8  # only a node without children takes a hedge
