"""A member that breaks twice within a minute is held out, 15 s, then twice as long each time it goes on breaking,
and starts again at 15 s once it has been clean for ten minutes."""
from peers.plan.holds import HOLD_S, WINDOW_S, Holds


def test_one_fault_holds_nobody_and_two_within_a_minute_do():
    h = Holds()
    assert h.fault("a", 0.0) == 0.0 and not h.held("a", 0.0)
    assert h.fault("a", WINDOW_S + 1) == 0.0  # a minute apart: nothing
    assert h.fault("b", 100.0) == 0.0
    assert h.fault("a", WINDOW_S + 30) == HOLD_S
    assert h.held("a", WINDOW_S + 30 + HOLD_S - 0.1) and not h.held("a", WINDOW_S + 30 + HOLD_S)
    assert h.left("a", WINDOW_S + 31) == HOLD_S - 1 and not h.held("b", 101.0)


def test_holds_double_while_it_goes_on_breaking_and_start_again_after_a_clean_spell():
    h, now, holds = Holds(), 0.0, []
    for _ in range(8):
        h.fault("a", now)
        holds.append(h.fault("a", now + 1))
        now += 1 + holds[-1] + 1  # breaks again just after each hold
    assert holds == [HOLD_S, 2 * HOLD_S, 4 * HOLD_S, 8 * HOLD_S, 16 * HOLD_S, 32 * HOLD_S, 32 * HOLD_S, 32 * HOLD_S]
    now += 700  # ten minutes and more without a fault
    h.fault("a", now)
    assert h.fault("a", now + 1) == HOLD_S


def test_faults_while_held_count_for_nothing():
    h = Holds()
    h.fault("a", 0.0)
    assert h.fault("a", 1.0) == HOLD_S
    assert h.fault("a", 2.0) == 0.0 and h.fault("a", 3.0) == 0.0 and h.left("a", 3.0) == HOLD_S - 2


def test_sfchat_hold_s_sets_the_first_hold_and_zero_holds_nobody(monkeypatch):
    monkeypatch.setenv("SFCHAT_HOLD_S", "1")
    h = Holds()
    h.fault("a", 0.0)
    assert h.fault("a", 1.0) == 1.0
    monkeypatch.setenv("SFCHAT_HOLD_S", "0")
    h.fault("b", 0.0)
    assert h.fault("b", 1.0) == 0.0 and not h.held("b", 1.0)
