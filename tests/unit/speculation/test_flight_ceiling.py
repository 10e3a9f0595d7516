"""scripts/flight_ceiling.py's bound: the likeliest tree's expected tokens, and rounds in flight never below one at
a time."""
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
from flight_ceiling import best, fit, rates  # noqa: E402


def test_best_is_the_likeliest_tree_by_brute_force():
    first, second = 0.7, 0.5
    chance = {"a": first, "b": (1 - first) * second}

    def reached(path: str) -> float:
        return math.prod(chance[c] for c in path)

    trees = {frozenset()}  # every tree of n nodes (a node: its path of choices from the committed token)
    for n in range(1, 7):
        trees = {t | {p + c} for t in trees for p in ("", *t) for c in "ab" if p + c not in t}
        likeliest = max(sum(reached(p) for p in t) for t in trees)
        assert abs(best(n, first, second) - (1 + likeliest)) < 1e-9


def test_a_perfect_draft_yields_every_node():
    assert best(5, 1.0, 0.0) == 6


def test_rounds_in_flight_gain_only_where_a_link_leaves_the_stages_idle():
    stages = [fit([(1, 70.0), (9, 120.0)]), fit([(1, 40.0), (9, 80.0)])]
    assert stages[0] == (63.75, 6.25)
    slow_one, slow_fly = rates(175, stages, 0.8, 0.6)
    fast_one, fast_fly = rates(0, stages, 0.8, 0.6)
    assert slow_fly / slow_one > fast_fly / fast_one >= 1
