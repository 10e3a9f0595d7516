"""The drift watch alone (peers/plan/drift.py): a member's rounds against its own baseline under a plan."""
from peers.plan.drift import BASELINE, COOLDOWN_S, HOLD, HOLD_S, SMALL, Drift


def feed(d: Drift, ms_per_layer: list[float], t0: float = 0.0, every_s: float = 1.0, name: str = "b",
         positions: int = 4) -> float:
    t = t0
    for ms in ms_per_layer:
        d.observe(name, ms * 10, 10, positions, t)
        t += every_s
    return t


def test_a_member_slowed_for_long_enough_has_drifted_by_how_far():
    d = Drift()
    t = feed(d, [2.0] * BASELINE + [2.1, 1.9] * 10)
    assert d.drifted(t) == {}
    t = feed(d, [5.0] * HOLD, t)
    assert d.drifted(t) == {"b": 2.5}


def test_no_drift_without_the_hold_or_in_a_flapping_member_or_in_prefills():
    d = Drift()
    t = feed(d, [2.0] * BASELINE)
    assert d.drifted(feed(d, [5.0] * (HOLD - 1), t)) == {}  # too few rounds
    d = Drift()
    t = feed(d, [2.0] * BASELINE)
    assert d.drifted(feed(d, [5.0] * HOLD * 2, t, every_s=HOLD_S / (4 * HOLD))) == {}  # too short a while
    d = Drift()
    t = feed(d, [2.0] * BASELINE)
    assert d.drifted(feed(d, [5.0, 2.0] * HOLD * 2, t)) == {}  # in and out: never a run
    d = Drift()
    t = feed(d, [2.0] * BASELINE)
    assert d.drifted(feed(d, [0.5, 5.0] * HOLD * 2, t)) == {}  # both ways in turn: never one run
    d = Drift()
    t = feed(d, [2.0] * BASELINE)
    assert d.drifted(feed(d, [50.0] * HOLD * 2, t, positions=SMALL + 1)) == {}  # prefills are not compared


def test_faster_drifts_too_and_a_replan_cools_down_with_new_baselines():
    d = Drift()
    t = feed(d, [2.0] * BASELINE + [0.5] * HOLD)
    assert d.drifted(t) == {"b": 0.25}
    d.replanned(t)
    t = feed(d, [0.5] * BASELINE + [5.0] * HOLD, t)  # the new baseline is 0.5: 5.0 is 10x
    assert d.drifted(t) == {}  # cooling down
    assert d.drifted(t + COOLDOWN_S) == {"b": 10.0}
