"""--dtype and --quant per peer: a ring whose peer runs bfloat16, int8 (torch's kernel on a CPU) or bitsandbytes nf4
still answers."""
import subprocess
import sys

import pytest
import torch

import trio

from helpers import cosine_to_float, greedy_reply, running_ring
from peers.compute import quant as q
from peers.compute.shard import Shard, Span
from tiny import one


@pytest.mark.parametrize("quant", ["int8", "nf4"])
def test_quantized_shard_is_close_to_float(quant, tiny_llama):
    full = Shard(tiny_llama, Span(0, 4, 4), embed=True, head=True)
    q = Shard(tiny_llama, Span(0, 4, 4), embed=True, head=True, quant=quant)
    ids = torch.tensor([[5, 17, 42, 99, 7]])
    a = full.logits(one(full, full.new_session(), 0, ids))
    b = q.logits(one(q, q.new_session(), 0, ids))
    # 4-bit random 64-wide weights lose a lot; the logits must still point the same way
    assert torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0) > (0.99 if quant == "int8" else 0.9)
    maker = {"int8": "peers.compute.cpu_quant", "nf4": "bitsandbytes"}[quant]  # a CPU's int8: torch's own kernel
    assert any(maker in type(m).__module__ for m in q.layers.modules())


@pytest.mark.parametrize("flags,least", [(["--dtype", "bfloat16"], 0.999), (["--quant", "int8"], 0.99)])
def test_ring_runs_in_other_dtypes(flags, least, tiny_llama):
    """A peer in bfloat16 or int8: the ring's logits point where float32 transformers' do, and it answers."""
    async def main():
        async with running_ring(tiny_llama, 1, extra=flags) as (host, _):
            assert host.members_info()[1]["dtype"] == ("bfloat16" if "bfloat16" in flags else "float32")
            cosine = await cosine_to_float(host, [5, 17, 42, 99, 7, 3, 250, 11])
            return cosine, await greedy_reply(host, "hello world", 8)

    cosine, ids = trio.run(main)
    print(f"{flags}: least cosine to float32 {cosine:.5f}")
    assert cosine > least
    assert len(ids) == 8  # (this tiny model never ends its turn early)


@pytest.mark.parametrize("quant,stored", [("int8", torch.int8), ("nf4", torch.uint8)])
def test_weights_are_stored_quantized(quant, stored, tiny_llama):
    s = Shard(tiny_llama, Span(0, 2, 4), embed=False, head=False, quant=quant)
    linears = [m for m in s.layers.modules() if hasattr(m, "weight") and m.weight.ndim == 2]
    assert linears and all(m.weight.dtype == stored for m in linears)


@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_a_matrix_quantized_rows_at_a_time_is_what_bitsandbytes_makes_of_it_whole(kind, monkeypatch):
    import bitsandbytes as bnb

    monkeypatch.setattr(q, "CHUNK_BYTES", 4 * 67 * 64)  # 64 rows a chunk, and a last block of 64 values cut short
    w = torch.randn(200, 67)
    asked = []

    def read_rows(a, b):
        asked.append(b - a)
        return w[a:b].clone()

    mine, theirs = (torch.nn.Sequential(torch.nn.Linear(67, 200, bias=False)).to("meta") for _ in range(2))
    q.swap_linears(mine, kind, torch.float32)
    q.swap_linears(theirs, kind, torch.float32)
    q.quantize(mine[0], read_rows, (200, 67), torch.device("cpu"))
    if kind == "nf4":
        theirs[0].weight = bnb.nn.Params4bit(w.clone(), requires_grad=False, quant_type="nf4").to("cpu")
        a, b = mine[0].weight.quant_state, theirs[0].weight.quant_state
        assert torch.equal(a.absmax, b.absmax) and torch.equal(a.offset, b.offset)
        assert torch.equal(a.state2.absmax, b.state2.absmax) and a.shape == b.shape and a.dtype == b.dtype
    else:
        theirs[0].weight = bnb.nn.Int8Params(w.clone(), requires_grad=False, has_fp16_weights=False).to("cpu")
        assert torch.equal(mine[0].weight.SCB, theirs[0].weight.SCB)
    assert torch.equal(mine[0].weight.data, theirs[0].weight.data)
    x = torch.randn(3, 67)
    with torch.inference_mode():
        assert torch.equal(mine(x), theirs(x))
    assert sum(asked) == 200 and max(asked) * 67 * 4 <= q.CHUNK_BYTES  # never more than a chunk in full precision


@pytest.fixture(scope="module")
def wide_llama(tmp_path_factory):
    """Four wide layers (~200 MB each in float32) and a tiny vocabulary: the span is nearly all the memory."""
    from tiny import make_model
    return make_model(tmp_path_factory.mktemp("wide-llama"), "llama", layers=4, hidden=2048, intermediate_size=5632,
                      num_attention_heads=16, num_key_value_heads=16)


def test_nf4_member_peaks_well_under_float32_even_on_a_busy_machine(wide_llama):
    """A member reads and quantizes each matrix a chunk of rows at a time: its peak while loading stays near the
    quantized size plus one chunk in full precision, far under the same span loaded in float32, and a process
    keeping a core busy meanwhile changes nothing (nothing it holds depends on how fast it goes)."""
    async def peak_of_span(quant: str) -> int:
        # the host offers just enough for the embedding, head and a pass: the member holds all four layers
        async with running_ring(wide_llama, 1, extra=["--quant", quant], offer_gb=0.09,
                                conversations=1) as (host, _):
            (m,) = host.ring
            assert m.span.size == 4 and m.peak > 0, host.members_info()
            return m.peak - m.rss_before

    float32 = trio.run(peak_of_span, "none")
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        nf4 = trio.run(peak_of_span, "nf4")
    finally:
        burner.kill()
        burner.wait()
    span_bytes = 4 * (4 * 2048 * 2048 + 3 * 2048 * 5632 + 2 * 2048) * 4
    assert float32 > 0.9 * span_bytes, (float32, span_bytes)
    assert nf4 <= 0.35 * float32, (nf4, float32)
