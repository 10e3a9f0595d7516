"""The check of the plan's figures once placed (peers/plan/calibration.py): each stage's first rounds against the
ms per layer the plan assumed, over the host's own such ratio."""
from peers.plan.calibration import FACTOR, HOST, REFERENCE, ROUNDS, SMALL, Calibration


def feed(c: Calibration, per_layer: dict[str, float], layers: dict[str, int], rounds: int = ROUNDS,
         positions: int = 4) -> None:
    for _ in range(rounds):
        for name, ms in per_layer.items():
            c.observe(name, ms * layers[name], positions)


def test_a_member_slower_than_its_figure_is_found_after_its_first_rounds():
    c = Calibration()
    layers = {HOST: 10, "a": 20}
    c.planned({HOST: (10, 1.2), "a": (20, 1.0)})  # a timed itself faster than the host
    feed(c, {HOST: 1.2, "a": 3.0}, layers, ROUNDS - 1)
    assert c.off() == {}  # not before its rounds
    feed(c, {HOST: 1.2, "a": 3.0}, layers, 1)
    assert c.off() == {"a": 3.0}
    c.correct(["a"])
    c.planned({HOST: (25, 1.2), "a": (5, 3.0)})
    feed(c, {HOST: 1.2, "a": 9.0}, {HOST: 25, "a": 5})
    assert c.off() == {}  # once while it stays: what changes later is drift's


def test_an_offset_that_hits_every_stage_alike_is_no_news():
    c = Calibration()
    c.planned({HOST: (10, 1.0), "a": (20, 1.0)})
    feed(c, {HOST: 2.0, "a": 2.1}, {HOST: 10, "a": 20})  # the model's layers cost twice the reference, everywhere
    assert c.off() == {}
    c.planned({HOST: (10, 1.0), "a": (20, 1.0)})
    feed(c, {HOST: 2.0, "a": 4.4}, {HOST: 10, "a": 20})  # slower than the host's yardstick says
    assert c.off() == {"a": 2.2}
    c.planned({HOST: (10, 1.0), "a": (20, 1.0)})
    feed(c, {HOST: 2.0, "a": 0.5}, {HOST: 10, "a": 20})  # faster: the host's own costs can make it look so
    assert c.off() == {}


def test_without_the_host_holding_layers_only_slower_in_small_rounds_counts():
    c = Calibration()
    c.planned({HOST: (0, 1.2), "a": (30, 1.0)})  # the member holds every layer
    feed(c, {"a": 0.6}, {"a": 30})  # one-position rounds are cheaper than the reference's pass: no news
    assert c.off() == {}
    c.planned({HOST: (0, 1.2), "a": (30, 1.0)})
    feed(c, {"a": 2.0}, {"a": 30}, positions=REFERENCE + 1)  # bigger rounds than the reference's: not counted
    assert c.off() == {}
    feed(c, {"a": 2.0}, {"a": 30}, positions=REFERENCE)
    assert c.off() == {"a": 2.0}


def test_noise_a_few_layers_of_overhead_and_prefills_are_not_a_wrong_figure():
    c = Calibration()
    c.planned({HOST: (10, 1.0), "a": (20, 1.0)})
    feed(c, {HOST: 1.0, "a": FACTOR * 0.95}, {HOST: 10, "a": 20})  # within the factor
    assert c.off() == {}
    c.planned({HOST: (29, 1.0), "a": (1, 1.0)})
    feed(c, {HOST: 1.0, "a": 2.5}, {HOST: 29, "a": 1})  # one layer's overhead: a small part of the token
    assert c.off() == {}
    c.planned({HOST: (10, 1.0), "a": (20, 1.0)})
    feed(c, {HOST: 1.0, "a": 50.0}, {HOST: 10, "a": 20}, positions=SMALL + 1)
    assert c.off() == {}


def test_a_member_that_leaves_is_judged_again_when_it_comes_back():
    c = Calibration()
    c.planned({HOST: (10, 1.0), "a": (20, 1.0)})
    feed(c, {HOST: 1.0, "a": 3.0}, {HOST: 10, "a": 20})
    c.correct(c.off())
    c.planned({HOST: (30, 1.0)}, present=[HOST])  # a left
    c.planned({HOST: (10, 1.0), "a": (20, 1.0)}, present=[HOST, "a"])  # and joined again, with a new figure
    feed(c, {HOST: 1.0, "a": 3.0}, {HOST: 10, "a": 20})
    assert c.off() == {"a": 3.0}
