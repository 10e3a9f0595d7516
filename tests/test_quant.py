"""--dtype and --quant per peer: a ring whose peer runs bfloat16 or bitsandbytes int8/nf4 still answers."""
import pytest
import torch

import trio

from helpers import cosine_to_float, greedy_reply, running_ring
from peers.shard import Shard, Span


@pytest.mark.parametrize("quant", ["int8", "nf4"])
def test_quantized_shard_is_close_to_float(quant, tiny_llama):
    full = Shard(tiny_llama, Span(0, 4, 4), embed=True, head=True)
    q = Shard(tiny_llama, Span(0, 4, 4), embed=True, head=True, quant=quant)
    ids = torch.tensor([[5, 17, 42, 99, 7]])
    a = full.logits(full.forward(full.new_session(), 0, ids))
    b = q.logits(q.forward(q.new_session(), 0, ids))
    # 4-bit random 64-wide weights lose a lot; the logits must still point the same way
    assert torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0) > (0.99 if quant == "int8" else 0.9)
    assert any("bitsandbytes" in type(m).__module__ for m in q.layers.modules())


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


@pytest.fixture(scope="module")
def wide_llama(tmp_path_factory):
    """Four wide layers (~200 MB each in float32) and a tiny vocabulary: the span is nearly all the memory."""
    from tiny import make_model
    return make_model(tmp_path_factory.mktemp("wide-llama"), "llama", layers=4, hidden=2048, intermediate_size=5632,
                      num_attention_heads=16, num_key_value_heads=16)


def test_nf4_member_peaks_well_under_float32(wide_llama):
    """A member quantizes each matrix as it reads it: its peak while loading stays near the quantized size plus
    one matrix in full precision, far under the same span loaded in float32."""
    async def peak_of_span(quant: str) -> int:
        # the host offers just enough for the embedding, head and a pass: the member holds all four layers
        async with running_ring(wide_llama, 1, extra=["--quant", quant], offer_gb=0.08) as (host, _):
            (m,) = host.ring
            assert m.span.size == 4 and m.peak > 0, host.members_info()
            return m.peak - m.rss_before

    float32, nf4 = trio.run(peak_of_span, "none"), trio.run(peak_of_span, "nf4")
    span_bytes = 4 * (4 * 2048 * 2048 + 3 * 2048 * 5632 + 2 * 2048) * 4
    assert float32 > 0.9 * span_bytes, (float32, span_bytes)
    assert nf4 <= 0.45 * float32, (nf4, float32)
