"""Perplexity and top-1 agreement of a CPU's number formats against float32, over a fixed text (docs/benchmarks.md).

    python scripts/quant_quality.py [--model smollm2-135m] [--text FILE] [--tokens 2048] [--window 512] [--formats …]

Each format loads the whole model in one Shard (the code a ring member runs) and reads the text in windows of
--window tokens, each from an empty cache; every position's next-token log-likelihood counts (a window's first
token has no context and is not scored). top-1: the share of positions where the format's most likely next token
is float32's.
"""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer

from peers import models
from peers.base.span import Span
from peers.compute.shard import Shard

FORMATS = [("float32", "none"), ("bfloat16", "none"), ("bfloat16", "int8"), ("bfloat16", "int4"),
           ("float32", "int4")]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model")
    p.add_argument("--text", default=str(Path(__file__).resolve().parent.parent / "README.md"))
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--formats", default=",".join(f"{d}:{q}" for d, q in FORMATS),
                   help="DTYPE:QUANT,… (the first is the reference; default: %(default)s)")
    args = p.parse_args()
    model_dir = models.resolve(args.model)
    ids = AutoTokenizer.from_pretrained(model_dir)(Path(args.text).read_text())["input_ids"][: args.tokens + 1]
    if len(ids) < args.tokens + 1:
        raise SystemExit(f"{args.text} has {len(ids)} tokens, fewer than --tokens {args.tokens} + 1")
    n_layers = AutoConfig.from_pretrained(model_dir).num_hidden_layers
    ref = None
    print(f"{args.text}: {args.tokens} tokens, windows of {args.window}; model {model_dir.name}")
    print("| dtype | quant | perplexity | vs float32 | top-1 agreement | s |")
    print("|---|---|---|---|---|---|")
    for dtype, quant in (f.split(":") for f in args.formats.split(",")):
        start = time.monotonic()
        shard = Shard(model_dir, Span(0, n_layers, n_layers), embed=True, head=True, dtype=dtype, quant=quant)
        nll, top = [], []
        for a in range(0, args.tokens, args.window):
            x = torch.tensor([ids[a : min(a + args.window, args.tokens) + 1]])
            h = shard.forward([(shard.new_session(), 0, x[:, :-1], None)])[0]
            logp = torch.log_softmax(shard.logits(h)[0].float(), -1)
            nll.append(-logp[torch.arange(x.shape[1] - 1), x[0, 1:]])
            top.append(logp.argmax(-1))
        nll, top = torch.cat(nll), torch.cat(top)
        ppl = math.exp(nll.mean().item())
        ref = ref or (ppl, top)
        print(f"| {dtype} | {quant} | {ppl:.3f} | {ppl / ref[0] - 1:+.2%} | {(top == ref[1]).float().mean():.2%} "
              f"| {time.monotonic() - start:.0f} |", flush=True)


if __name__ == "__main__":
    main()
