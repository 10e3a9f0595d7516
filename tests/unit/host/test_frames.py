"""How a batch of rounds goes in frames (peers/host/rounds.py): rounds share one frame up to a frame's worth of
positions, but a frame with a replay (a conversation the ring held before, from its first position after a
re-plan) stops at SHARED_CHUNK positions, so that each conversation's next token comes with its own replay, not
after every conversation's."""
from types import SimpleNamespace

from peers.host.batcher import Round
from peers.host.rounds import PassEngine
from peers.host.turns import SHARED_CHUNK


class Engine(PassEngine):
    def committed(self, s):
        return s.held

    def _frame_positions(self):
        return 1024


def rnd(sid: str, held: int, new: int, drafts: int = 0, before: bool = True) -> Round:
    """A round of conversation `sid` whose stages hold `held` of its tokens, with `new` more and `drafts`;
    `before`: the ring held the conversation before (else it is a prompt's first pass)."""
    s = SimpleNamespace(sid=sid, held=held, filled=50 if before else 0)
    return Round(s, tokens=list(range(held + new)), drafts=[0] * drafts, parents=None, sent=None)


def sids(frames):
    return [[r.s.sid for r in f] for f in frames]


def test_rounds_that_continue_share_one_frame():
    rounds = [rnd(f"c{i}", 50, 1, 8) for i in range(16)]  # 16 x 9 positions
    assert sids(Engine()._frames(rounds)) == [[f"c{i}" for i in range(16)]]


def test_prompts_share_one_frame():
    rounds = [rnd(f"p{i}", 0, 45, before=False) for i in range(8)]
    assert sids(Engine()._frames(rounds)) == [[f"p{i}" for i in range(8)]]


def test_replays_after_a_replan_go_in_frames_of_their_own():
    rounds = [rnd(f"c{i}", 0, 45, 4) for i in range(8)]  # every conversation from its first position: 49 each
    assert sids(Engine()._frames(rounds)) == [[f"c{i}"] for i in range(8)]


def test_short_replays_share_a_frame_up_to_a_shared_chunk():
    rounds = [rnd("a", 0, 20), rnd("b", 0, 20), rnd("c", 0, 20), rnd("d", 0, 20)]
    frames = Engine()._frames(rounds)
    assert sids(frames) == [["a", "b", "c"], ["d"]]
    assert all(sum(len(r.tokens) + len(r.drafts) for r in f) <= SHARED_CHUNK for f in frames)


def test_a_replay_does_not_join_a_full_frame_of_rounds_and_rounds_after_it_fill_a_new_one():
    rounds = [rnd(f"c{i}", 50, 1, 8) for i in range(8)] + [rnd("again", 0, 40)] + [rnd("late", 50, 1, 8)]
    assert sids(Engine()._frames(rounds)) == [[f"c{i}" for i in range(8)], ["again", "late"]]
