"""--quant int4|int8 on a CPU: torch's int4/int8 kernels, the layout they read, rows quantized a chunk at a time."""
from functools import partial

import pytest
import torch

from peers.compute import cpu_quant as cq
from peers.compute.shard import Shard, Span
from tiny import one


def test_int4_layout_is_q_minus_8_times_scale_plus_zero():
    """A Q4_1 block (w = d*q + m, q spanning 0..15) comes back on its own grid: scale = d, zero = m + 8d, and the
    kernel multiplies by exactly that matrix."""
    torch.manual_seed(0)
    n, k = 64, 128
    d = (torch.rand(n, k // 32, 1) * 0.05 + 0.01).to(torch.bfloat16).float()
    m = (-8 * d).to(torch.bfloat16).float()  # m + 8d = 0: exact in bfloat16
    q = torch.randint(0, 16, (n, k // 32, 32)).float()
    q[..., 0], q[..., 1] = 0, 15  # each block spans the whole grid, as the Q4_1 quantizer leaves it
    w = (d * q + m).reshape(n, k)
    layer = cq.Int4Linear(k, n)
    cq.quantize(layer, lambda a, b: w[a:b], (n, k))
    assert torch.equal(layer.scales_zeros[..., 0].float().t(), d[..., 0])  # scale = d
    assert not layer.scales_zeros[..., 1].any()  # zero = m + 8d
    assert torch.equal(cq.dequantize(layer), w.to(torch.bfloat16).float())  # (the kernel's output is bfloat16)
    x = torch.randn(3, k, dtype=torch.bfloat16)
    torch.testing.assert_close(layer(x).float(), x.float() @ w.t(), rtol=0.02, atol=0.02)


@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_rows_quantized_a_chunk_at_a_time_are_the_whole_matrix_quantized(kind, monkeypatch):
    torch.manual_seed(1)
    w = torch.randn(208, 96)
    whole = torch.nn.Sequential(torch.nn.Linear(96, 208, bias=False))
    rows = torch.nn.Sequential(torch.nn.Linear(96, 208, bias=False))
    cq.swap_linears(whole, kind)
    cq.swap_linears(rows, kind)
    cq.quantize(whole[0], lambda a, b: w[a:b], (208, 96))
    monkeypatch.setattr(cq, "CHUNK_BYTES", 4 * 96 * 48)  # 48 rows a chunk (int4: one block of 64)
    asked = []
    cq.quantize(rows[0], lambda a, b: asked.append(b - a) or w[a:b], (208, 96))
    assert asked == ([64, 64, 64, 16] if kind == "int4" else [48, 48, 48, 48, 16])
    assert torch.equal(cq.dequantize(whole[0]), cq.dequantize(rows[0]))
    err = (cq.dequantize(rows[0]) - w).abs().max()
    assert err < (0.3 if kind == "int4" else 0.03)
    x = torch.randn(2, 96)
    assert torch.equal(whole(x), rows(x)) and whole(x).dtype == torch.float32


@pytest.mark.parametrize("kind,stored", [("int4", torch.uint8), ("int8", torch.int8)])
def test_a_cpu_shard_keeps_its_matrices_quantized_head_included(kind, stored, tiny_llama):
    full = Shard(tiny_llama, Span(0, 4, 4), embed=True, head=True)
    s = Shard(tiny_llama, Span(0, 4, 4), embed=True, head=True, quant=kind)
    layers = [m for m in s.layers.modules() if isinstance(m, (cq.Int4Linear, cq.Int8Linear))]
    assert len(layers) == 4 * 7 and isinstance(s.lm_head, (cq.Int4Linear, cq.Int8Linear))
    held = [m.packed if kind == "int4" else m.weight for m in layers]
    assert all(t.dtype == stored for t in held)
    ids = torch.tensor([[5, 17, 42, 99, 7]])
    a = full.logits(one(full, full.new_session(), 0, ids))
    b = s.logits(one(s, s.new_session(), 0, ids))
    assert torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0) > (0.99 if kind == "int8" else 0.9)  # (random 4-bit weights lose a lot)


@pytest.mark.parametrize("flags", [["--quant", "int4"], ["--dtype", "bfloat16"]])
def test_a_ring_of_two_peers_answers_what_one_process_does_with_the_same_kernels(flags, tiny_llama):
    """Host + 2 peer processes, every member in int4 (or bfloat16): greedy tokens identical to one process with
    the same weights, dtype and kernels, and not those of float32 (so the kernels did run)."""
    import trio

    from helpers import greedy_reply, running_ring

    opts = {"quant": "int4"} if "int4" in flags else {"dtype": "bfloat16"}
    prompt = "the quick brown fox jumps over the lazy dog and"

    async def reply(n_peers: int, extra: list[str], **kw):
        async with running_ring(tiny_llama, n_peers, extra=extra, **kw) as (host, _):
            logits, _ = await host.forward(host.new_session("check"), [5, 17, 42, 99, 7, 3, 250, 11], [])
            return await greedy_reply(host, prompt, 24), logits, host.members_info()

    ring, ring_logits, members = trio.run(partial(reply, 2, flags, **opts))
    alone, alone_logits, _ = trio.run(partial(reply, 0, [], **opts))
    plain, _, _ = trio.run(reply, 0, [])
    assert len(members) == 3 and all(m["quant" if "int4" in flags else "dtype"] == flags[1] for m in members)
    assert ring == alone
    assert torch.equal(ring_logits, alone_logits)  # the same kernels on the same shapes: the same bits
    assert alone != plain


def test_auto_is_int4_on_a_cpu_for_the_embedded_default_and_members_follow_the_host(monkeypatch):
    monkeypatch.delenv("SFCHAT_CPU_QUANT")  # (the suite pins none: tests/conftest.py)
    assert cq.pick_quant("auto", "cpu", True) == "int4"
    assert cq.pick_quant("auto", "cpu", False) == cq.pick_quant("auto", "cuda:0", True) == "none"
    assert cq.pick_quant("none", "cpu", True) == "none" and cq.pick_quant("nf4", "cuda", False) == "nf4"
    assert cq.follow("auto", "cpu", "int4") == "int4" and cq.follow("int8", "cpu", "int4") == "int8"
    assert cq.follow("auto", "cuda", "int4") == cq.follow("auto", "cpu", "nf4") == "none"


def test_the_embedded_default_runs_int4_through_a_ring_by_default(smollm2, monkeypatch):
    """No --quant anywhere: the host and its member (told nothing) both hold int4 layers, and the plan counts them
    so; --quant none brings float32 back."""
    import trio

    from helpers import greedy_reply, running_ring

    monkeypatch.delenv("SFCHAT_CPU_QUANT")

    async def main():
        async with running_ring(smollm2, 1) as (host, _):
            kinds = {type(m).__name__ for m in host.shard.layers.modules()}
            return host.quant, kinds, host.planner.offers(host.ring)[1].quant, await greedy_reply(host, "Hi", 4)

    quant, kinds, member, ids = trio.run(main)
    assert quant == "int4" and "Int4Linear" in kinds and member == "int4" and len(ids) > 0


@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_the_plan_counts_a_cpu_layer_s_real_bytes_scales_included(kind, tiny_llama):
    from peers.models import checkpoint
    from peers.plan.layers import ModelSize, weight_bytes

    m = ModelSize.of(checkpoint.read_config(tiny_llama), checkpoint.tensor_shapes(tiny_llama))
    s = Shard(tiny_llama, Span(0, 2, 4), embed=False, head=False, dtype="bfloat16", quant=kind)
    held = [t for mod in s.layers.modules() for t in mod._parameters.values() if t is not None]
    held += [t for mod in s.layers.modules() for t in (getattr(mod, a, None) for a in ("packed", "scales_zeros", "scales"))
             if t is not None]
    real = sum(t.numel() * t.element_size() for t in held) / 2
    planned = weight_bytes(m, "bfloat16", kind)
    assert real <= planned <= 1.05 * real, (real, planned)  # (int8's scale per row is planned as float32)


def test_bench_s_plain_transformers_row_runs_the_ring_s_kernels_on_the_same_weights(tiny_llama):
    """bench's one-process baseline under --quant int4: plain transformers whose matrices are the shard's int4
    layers (the head int8), quantized from the same float32 weights: the same logits as a shard of every layer."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from sfchat.bench import load_baseline

    base = load_baseline(SimpleNamespace(device="cpu", dtype="bfloat16", quant="int4"), tiny_llama,
                         AutoTokenizer.from_pretrained(tiny_llama))
    kinds = {type(m).__name__ for m in base.model.modules()}
    assert "Int4Linear" in kinds and "Linear" not in kinds and type(base.model.lm_head) is cq.Int8Linear
    s = Shard(tiny_llama, Span(0, 4, 4), embed=True, head=True, dtype="bfloat16", quant="int4")
    ids = torch.tensor([[5, 17, 42, 99, 7]])
    with torch.no_grad():
        plain = base.model(ids).logits[0, -1].float()
    ring = s.logits(one(s, s.new_session(), 0, ids)).float().reshape(-1, plain.numel())[-1]
    assert torch.nn.functional.cosine_similarity(plain, ring, dim=0) > 0.999
    assert plain.argmax() == ring.argmax()
