"""Which of a CPU pass's operations give a row the same bits alone as among other rows (docs/benchmarks.md,
"Answers that repeat"). For each operation and each pass size M: a row computed alone against the same row inside
a pass of M rows; attention also with its keys padded as a longer pass pads them. Prints one line per operation.

    python scripts/pass_invariance.py
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from peers.compute import cpu_quant as cq
from peers.compute import invariant

SIZES = (2, 8, 16, 32, 33, 64, 128)


def linear_rows(op, k: int, dtype) -> list[int]:
    x = torch.randn(max(SIZES), k).to(dtype)
    alone = torch.cat([op(x[i : i + 1]) for i in range(max(SIZES))])
    return [m for m in SIZES if not torch.equal(op(x[:m]), alone[:m])]


def quantized(kind: str, w: torch.Tensor):
    layer = cq.swapped(torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta"), kind)
    cq.quantize(layer, lambda a, b: w[a:b], tuple(w.shape))
    return layer


def attention_rows(invariant_kernel: bool, heads=9, kv_heads=3, dim=64, context=300) -> list[int]:
    """Queries at positions context..context+M-1 over a cache: each row alone (a one-token pass) against the rows
    of one pass of M."""
    keys = torch.randn(1, kv_heads, 1024, dim).to(torch.bfloat16)
    values = torch.randn(1, kv_heads, 1024, dim).to(torch.bfloat16)
    q = torch.randn(1, heads, max(SIZES), dim).to(torch.bfloat16)
    rep, scale = heads // kv_heads, dim ** -0.5

    def run(start: int, m: int) -> torch.Tensor:
        if invariant_kernel:
            plan = invariant.groups(context + start, 0, list(range(-1, m - 1)))
            return invariant.attend(q[:, :, start : start + m], keys, values, plan, scale, None).transpose(1, 2)
        end = context + start + m
        mask = torch.arange(end)[None, :] <= (context + start + torch.arange(m))[:, None]
        return F.scaled_dot_product_attention(q[:, :, start : start + m], keys[:, :, :end].repeat_interleave(rep, 1),
                                              values[:, :, :end].repeat_interleave(rep, 1), attn_mask=mask, scale=scale)
    alone = torch.cat([run(i, 1) for i in range(max(SIZES))], 2)
    return [m for m in SIZES if not torch.equal(run(0, m), alone[:, :, :m])]


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(2)
    say = lambda name, bad: print(f"{name:48} {'same bits at every M' if not bad else 'differs at M = ' + str(bad)}")
    for k, n in ((576, 1536), (8960, 1536)):
        w = torch.randn(n, k) * 0.05
        say(f"int4 linear {k}x{n}", linear_rows(quantized("int4", w), k, torch.bfloat16))
        say(f"int8 linear {k}x{n}", linear_rows(quantized("int8", w), k, torch.bfloat16))
        say(f"bfloat16 F.linear {k}x{n}", linear_rows(lambda x: F.linear(x, w.to(torch.bfloat16)), k, torch.bfloat16))
        say(f"float32 F.linear {k}x{n}", linear_rows(lambda x: F.linear(x, w), k, torch.float32))
    norm = torch.nn.RMSNorm(576).to(torch.bfloat16)
    say("RMSNorm (bfloat16)", linear_rows(norm, 576, torch.bfloat16))
    say("sdpa attention, bfloat16 (transformers' call)", attention_rows(False))
    say("peers/compute/invariant.py attention, bfloat16", attention_rows(True))


if __name__ == "__main__":
    with torch.inference_mode():
        main()
