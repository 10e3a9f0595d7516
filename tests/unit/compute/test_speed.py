"""A member's speed (peers/compute/speed.py): timed for real, within a second or two, slower with fewer threads."""
import math
import time

import torch

from peers.base.limits import SPEED_POSITIONS
from peers.compute import speed


def test_timing_a_reference_layer_is_quick_and_says_ms_per_pass_size(monkeypatch):
    monkeypatch.delenv("SFCHAT_TEST_MS_PER_LAYER", raising=False)
    t0 = time.perf_counter()
    by = speed.ms_per_layer("cpu", "float32")
    assert time.perf_counter() - t0 < 20  # (about one second alone; a test machine shared by others is slower)
    assert list(by) == list(SPEED_POSITIONS) and all(0 < v < 1e4 and math.isfinite(v) for v in by.values())
    assert speed.measure("cpu", "bfloat16", who="x") > 0


def test_a_fixed_figure_for_tests_by_name(monkeypatch):
    monkeypatch.setenv("SFCHAT_TEST_MS_PER_LAYER", "host=9,local-a=2")
    assert speed.measure("cpu", "float32", who="local-a") == 2.0 and speed.measure("cpu", "float32", who="host") == 9.0
    monkeypatch.setenv("SFCHAT_TEST_MS_PER_LAYER", "3")
    assert speed.measure("cpu", "float32", who="anyone") == 3.0


def test_a_reference_layer_costs_more_at_a_prefill_chunk_than_at_one_position(monkeypatch):
    monkeypatch.delenv("SFCHAT_TEST_MS_PER_LAYER", raising=False)
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        by = speed.ms_per_layer("cpu", "float32")
    finally:
        torch.set_num_threads(old)
    assert by[SPEED_POSITIONS[-1]] > by[SPEED_POSITIONS[0]]


def test_a_cpu_member_times_the_kernels_its_quantization_runs_on(monkeypatch):
    """int4/int8 on a CPU are torch's own kernels (peers/compute/cpu_quant.py), not bitsandbytes; a member left at
    `auto` times what it will follow, the host's int4 for the embedded default."""
    monkeypatch.delenv("SFCHAT_TEST_MS_PER_LAYER", raising=False)
    monkeypatch.delenv("SFCHAT_CPU_QUANT", raising=False)
    for quant in ("int4", "int8", "auto"):
        by = speed.ms_per_layer("cpu", "bfloat16", quant)
        assert all(ms > 0 and math.isfinite(ms) for ms in by.values()), (quant, by)


def test_the_figure_is_the_median_of_bursts_not_one_lucky_pass():
    """A process sharing its core with another program: most bursts slow, one on a core that was free for a
    moment. Its figure is the slow one; a hiccup inside a burst is left out."""
    bursts = [[2.1, 2.0, 2.2], [1.0, 1.1, 1.0], [2.0, 5.0, 2.1], [2.2, 2.0, 2.3], [1.9, 2.1, 2.0]]
    assert speed.figure(bursts) == 2.0
