"""The plan in bytes (peers/plan/layers.py): pure arithmetic, tested alone."""
import pytest

from peers.base.limits import GB
from peers.plan.layers import FitError, ModelSize, Offer, kv_bytes, chunk_end, chunk_positions, plan, split_layers, weight_bytes
from tiny import qwen2_shapes


def qwen25_7b() -> ModelSize:
    config = {"num_hidden_layers": 28, "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
              "num_key_value_heads": 4, "max_position_embeddings": 32768}
    return ModelSize.of(config, qwen2_shapes(28, 3584, 18944, 28, 4, 152064))


def test_sizes_from_shapes():
    m = qwen25_7b()
    # Qwen2.5-7B has 7.62e9 parameters: 28 layers plus embedding and head
    assert m.n_layers * (m.layer_matrix + m.layer_other) + m.host_weights == pytest.approx(7.62e9, rel=0.01)
    assert m.head_dim == 128 and m.default_context() == 8192
    assert weight_bytes(m, "bfloat16", "none") == 2 * (m.layer_matrix + m.layer_other)
    # nf4: a little over half a byte per matrix weight; int8 a byte plus a float32 per row
    assert weight_bytes(m, "bfloat16", "nf4") < 0.27 * weight_bytes(m, "bfloat16", "none")
    assert weight_bytes(m, "bfloat16", "int8") == m.layer_matrix + 4 * m.layer_rows + 2 * m.layer_other
    assert kv_bytes(m, "bfloat16", 8192) == 2 * 4 * 128 * 8192 * 2


def test_plan_respects_capacity():
    m = qwen25_7b()
    offers = [Offer("host", int(12 * GB), "bfloat16"), Offer("a", int(7 * GB), "bfloat16"),
              Offer("b", int(3 * GB), "bfloat16")]
    spans = plan(m, offers, 8192)
    assert sum(s.size for s in spans) == 28 and spans[0].start == 0
    per_layer = weight_bytes(m, "bfloat16", "none") + kv_bytes(m, "bfloat16", 8192)
    for s, o in zip(spans[1:], offers[1:]):
        assert s.size * per_layer <= o.free


def test_too_small_says_numbers_and_what_helps():
    m = qwen25_7b()
    offers = [Offer("host", int(6 * GB), "bfloat16"), Offer("a", int(5 * GB), "bfloat16")]
    with pytest.raises(FitError) as e:
        plan(m, offers, 8192)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("needs 17.1 GB") and "for 28 layers in bfloat16" in msg and "members offer 11.0 GB" in msg
    assert "add a member" in msg and "--quant nf4 (needs 7.4 GB)" in msg and "--max-context 2048" in msg
    # and nf4 really fits where it says it does
    assert sum(s.size for s in plan(m, [Offer(o.name, o.free, "bfloat16", "nf4") for o in offers], 8192)) == 28


def test_host_must_hold_embedding_and_head():
    with pytest.raises(FitError, match=r"the host needs 2\.\d GB for the embedding, head, drafter and a pass in bfloat16; it offers 1\.0 GB"):
        plan(qwen25_7b(), [Offer("host", int(1 * GB), "bfloat16"), Offer("a", int(100 * GB), "bfloat16")], 2048)


def test_mixed_members_each_in_its_own_bytes():
    m = qwen25_7b()
    # the same offer holds about 3.7x the layers in nf4 as in bfloat16
    spans = plan(m, [Offer("host", int(40 * GB), "bfloat16", "none"), Offer("q", int(8 * GB), "bfloat16", "nf4"),
                     Offer("f", int(8 * GB), "bfloat16", "none")], 8192)
    assert spans[1].size > 2.5 * spans[2].size


def chunks(n: int, size: int, tail: int = 1) -> list[tuple[int, int]]:
    out, a = [], 0
    while a < n:
        out.append((a, b := chunk_end(a, n, size, tail)))
        a = b
    return out


def test_chunks_cover_the_pass_and_keep_the_tail():
    size = chunk_positions(3584, 4, 64 << 20)
    assert size * 3584 * 4 <= (64 << 20) // 4
    assert chunks(100, size) == [(0, 100)]
    cut = chunks(6000, size)
    assert cut[0][0] == 0 and cut[-1][1] == 6000 and len(cut) > 1
    assert all(a == b for (_, a), (b, _) in zip(cut, cut[1:]))
    assert all(b - a <= size for a, b in cut)
    # the drafts and the position before them never split
    tail = chunks(2 * size + 3, size, tail=5)
    assert tail[-1][1] - tail[-1][0] >= 5 and tail[-1][1] == 2 * size + 3


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


def test_plan_is_free_of_torch():
    import subprocess
    import sys
    code = "import sys, peers.plan; assert 'torch' not in sys.modules, 'plan imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True)
