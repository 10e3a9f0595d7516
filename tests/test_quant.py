"""--dtype and --quant per peer: a ring whose peer runs bfloat16 or bitsandbytes int8/nf4 still answers."""
import pytest
import torch

from helpers import ask_json
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


@pytest.mark.parametrize("flags", [["--dtype", "bfloat16"], ["--quant", "int8"]])
def test_ring_runs_in_other_dtypes(flags, tiny_llama):
    got = ask_json("hello world", "--model", str(tiny_llama), "--local-peers", "1", "--max-new-tokens", "8",
                   "--draft", "none", "--temperature", "0", *flags)
    assert len(got["token_ids"]) == got["stats"]["tokens"] == 8  # (this tiny model never ends its turn early)
