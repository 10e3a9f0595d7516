"""Placement by speed (peers/plan/placement.py) against brute force over every split of a small model."""
import dataclasses
import itertools
import random

from peers.base.span import Span
from peers.plan.layers import ModelSize, Offer, capacities, covers, plan, predicted_ms
from peers.plan.placement import Stage, busiest_ms, place, sequence_ms


def splits(stages, n_layers):
    for counts in itertools.product(*(range(s.cap + 1) for s in stages)):
        if sum(counts) == n_layers:
            yield list(counts)


def random_stages(rng, k):
    return [Stage(rng.randint(0, 7), rng.choice([0.5, 1.0, 1.3, 2.0, 4.0, 9.0]),
                  0.0 if i == 0 else rng.choice([0.0, 0.4, 3.0, 86.0])) for i in range(k)]


def test_one_conversation_is_the_least_sum_over_every_split():
    rng = random.Random(7)
    for _ in range(300):
        stages, n = random_stages(rng, rng.randint(1, 4)), rng.randint(1, 12)
        best = min((sequence_ms(stages, c) for c in splits(stages, n)), default=None)
        got = place(stages, n)
        if best is None:
            assert got is None
            continue
        assert sum(got) == n and all(c <= s.cap for c, s in zip(got, stages))
        assert abs(sequence_ms(stages, got) - best) < 1e-6, (stages, n, got)


def test_many_conversations_is_the_least_busy_stage_over_every_split():
    rng = random.Random(11)
    for _ in range(300):
        stages, n = random_stages(rng, rng.randint(1, 4)), rng.randint(1, 12)
        best = min((busiest_ms(stages, c) for c in splits(stages, n)), default=None)
        got = place(stages, n, many=True)
        if best is None:
            assert got is None
            continue
        assert sum(got) == n and all(c <= s.cap for c, s in zip(got, stages))
        assert abs(busiest_ms(stages, got) - best) < 1e-6, (stages, n, got)


def test_a_slow_member_with_room_elsewhere_is_a_spare():
    # the host holds 20 of 30 layers, member 1 (as fast) 20, member 2 is 4x slower: it holds none
    stages = [Stage(20, 1.0), Stage(20, 1.0, 0.5), Stage(30, 4.0, 0.5)]
    assert place(stages, 30) == [20, 10, 0]
    # the same ring by memory would give member 2 the most layers
    # serving many, the slow one still takes a share: the busiest stage is what counts
    assert place(stages, 30, many=True)[2] > 0


def test_a_far_fast_member_loses_to_a_near_slow_one_for_few_layers():
    # 2 layers left beyond the host: 86 ms away costs more than 2 layers at 4 ms
    assert place([Stage(4, 1.0), Stage(10, 0.5, 86.0), Stage(10, 4.0, 0.1)], 6) == [4, 0, 2]


SMALL = ModelSize(n_layers=30, hidden=576, intermediate=1536, heads=9, kv_heads=3, head_dim=64, max_context=8192,
                  layer_matrix=3_500_000, layer_rows=5000, layer_other=1152, host_weights=30_000_000)


def test_plan_by_speed_puts_the_fast_members_first_and_leaves_the_slow_one_empty():
    gb = 2**30
    offers = [Offer("host", int(0.6 * gb), ms_per_layer=1.0), Offer("fast", int(0.45 * gb), ms_per_layer=1.0,
                                                                    link_ms=0.3),
              Offer("slow", 4 * gb, ms_per_layer=5.0, link_ms=0.3)]
    caps = capacities(SMALL, offers, 2048)
    assert caps[0] < 30 and caps[1] < 30 and caps[0] + caps[1] >= 30  # neither fast one alone, both together
    by_memory = plan(SMALL, offers, 2048, placement="memory")
    by_speed = plan(SMALL, offers, 2048, placement="speed")
    assert covers(by_speed, 30) and covers(by_memory, 30)
    assert by_memory[2].size > by_memory[1].size  # the big slow laptop gets the most by memory
    assert by_speed[2].size == 0 and by_speed[0] == Span(0, caps[0], 30) and by_speed[1].size == 30 - caps[0]
    assert predicted_ms(SMALL, offers, by_speed) < predicted_ms(SMALL, offers, by_memory) / 2


def test_plan_without_measured_speeds_falls_back_to_memory():
    gb = 2**30
    offers = [Offer("host", int(0.3 * gb)), Offer("a", int(0.3 * gb)), Offer("b", 2 * gb)]
    assert plan(SMALL, offers, 2048, placement="speed") == plan(SMALL, offers, 2048, placement="memory")


def test_local_peers_asked_for_hold_layers_evened_out():
    """`--local-peers 2` on one box: the host is fastest and could hold every layer, yet the ring the user asked
    for is a ring: each local peer holds layers, the busiest stage evened out; a slower one holds fewer."""
    gb = 2**30
    offers = [Offer("host", 4 * gb, ms_per_layer=1.0), Offer("local-a", 4 * gb, ms_per_layer=1.2, link_ms=1.0),
              Offer("local-b", 4 * gb, ms_per_layer=2.4, link_ms=1.0)]
    alone = plan(SMALL, offers, 2048, placement="speed")
    assert alone[0].size == 30 and alone[1].size == alone[2].size == 0  # by speed alone: two spares
    asked = [offers[0]] + [dataclasses.replace(o, must=True) for o in offers[1:]]
    spans = plan(SMALL, asked, 2048, placement="speed")
    assert covers(spans, 30) and all(s.size for s in spans), spans
    assert spans[0].size >= spans[1].size > spans[2].size  # in proportion to speed
    # a member asked for that the even-out would leave empty still gets a layer
    assert place([Stage(30, 1.0), Stage(30, 50.0, 1.0)], 30, many=True, must=frozenset({1}))[1] == 1
