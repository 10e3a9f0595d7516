"""Draft decoding speed on CUDA with and without CUDA graphs (static cache + torch.compile reduce-overhead).

Run where a GPU is lent: `python scripts/gpu_draft_bench.py [--model smollm2-135m] [--tokens 256]`.
Prints one JSON line per mode; CI never runs this.
"""
import argparse
import json
import statistics
import time

import torch

from peers import models
from peers.drafting import ModelDrafter
from peers.sampling import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a GPU"
    d = models.resolve(args.model)
    dtype = getattr(torch, args.dtype)
    for static in (False, True):
        drafter = ModelDrafter(d, 10**9, device="cuda", dtype=dtype, static=static, max_len=2048)
        ctx = list(range(100, 164))
        drafter.propose(ctx, 32, SamplingParams())  # warm-up (and graph capture)
        drafter.propose(ctx + [5], 32, SamplingParams())
        runs = []
        for r in range(5):
            torch.cuda.synchronize()
            t = time.perf_counter()
            drafter.propose(ctx + [r + 7], args.tokens, SamplingParams())
            torch.cuda.synchronize()
            runs.append(args.tokens / (time.perf_counter() - t))
        print(json.dumps({"mode": "cuda-graphs" if static else "eager", "model": args.model, "dtype": args.dtype,
                          "draft_tokens_per_second": round(statistics.median(runs), 1),
                          "gpu": torch.cuda.get_device_name()}))


if __name__ == "__main__":
    main()
