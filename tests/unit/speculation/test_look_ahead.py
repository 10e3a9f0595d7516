"""The look-ahead a round drafts while its pass is on the wire: used by the next round only where the bet came
true and that round drafts the same way (a model draft's chain has no chances for a tree round to rank)."""
from peers.speculation.generate import LookAhead
from peers.speculation.tree import Draft, chain


def test_a_chain_look_ahead_is_not_a_tree_round_s_and_back():
    for drafted_as_tree in (False, True):
        la = LookAhead()
        draft = Draft([7, 8], chain([7, 8]), [], None, 9)  # a chain with no chances, the target's guess 9
        ahead = la.bet([1, 2], draft, True, drafted_as_tree)
        ahead.draft, ahead.done = Draft([4], chain([4]), [], None), True
        la.settle(draft, [0, 1], 9)  # the bet came true: the next round starts from 1 2 7 8 9
        assert la.for_context([1, 2, 7, 8, 9], drafted_as_tree) is ahead
        assert la.for_context([1, 2, 7, 8, 9], not drafted_as_tree) is None
        assert la.for_context([1, 2, 7, 8], drafted_as_tree) is None
