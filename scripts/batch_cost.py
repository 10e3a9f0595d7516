"""Would one batched forward for several conversations' rounds pay on this machine? The embedded target, each
conversation with `--context` positions cached and a round of `--positions` new ones: B forwards of one
conversation each against one forward of B conversations at once (equal lengths: the best case for batching,
before any padding of unequal caches). Its linear layers compute as a CPU shard's do (peers/compute/cpu_linear.py).

    python scripts/batch_cost.py [--conversations 1,2,4,8] [--positions 3] [--context 300]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pass_cost import median_ms  # noqa: E402  (also puts the repository on the path)

from peers.compute.cpu_linear import use_columns  # noqa: E402
from peers.base.locations import models_dir  # noqa: E402
from peers.models.source import DEFAULT_MODEL  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--conversations", default="1,2,4,8")
    p.add_argument("--positions", type=int, default=3)
    p.add_argument("--context", type=int, default=300)
    a = p.parse_args()
    model = AutoModelForCausalLM.from_pretrained(models_dir() / DEFAULT_MODEL, dtype=torch.float32).eval()
    use_columns(model)
    print(f"{DEFAULT_MODEL}, {a.context} positions cached, rounds of {a.positions}, {torch.get_num_threads()} threads")
    print("| conversations | one at a time ms | batched ms | batched / one at a time |")
    print("|---|---|---|---|")
    for b in map(int, a.conversations.split(",")):
        ctx = torch.arange(a.context).repeat(b, 1) + 100
        new = torch.arange(a.positions).repeat(b, 1) + 500
        with torch.inference_mode():
            cache = DynamicCache()
            model(ctx, cache=cache)
            one = [DynamicCache() for _ in range(b)]
            for i, c in enumerate(one):
                model(ctx[i:i + 1], cache=c)

            def batched():
                model(new, cache=cache)
                cache.crop(-a.positions)  # the round is rejected: every repeat starts from the same cache

            def separate():
                for i, c in enumerate(one):
                    model(new[i:i + 1], cache=c)
                    c.crop(-a.positions)
            t_one, t_batch = median_ms(separate, 20), median_ms(batched, 20)
        print(f"| {b} | {t_one:.1f} | {t_batch:.1f} | {t_batch / t_one:.2f} |")


if __name__ == "__main__":
    main()
