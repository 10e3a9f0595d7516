"""What a forward pass of the embedded target costs by the number of positions it carries, in one process, and
what its LM head's product (the largest matrix) costs by the number of rows, as F.linear computes it (x @ W^T) and
as a CPU shard does (W @ x^T, peers/compute/cpu_linear.py). The cost is no straight line in the positions, which is why
the host measures each size of pass instead of fitting one.

    python scripts/pass_cost.py [--max-positions N] [--context N] [--threads N] [--cpu-time]

--cpu-time measures the process's CPU time instead of the wall clock: steadier on a machine other work shares.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peers.base.locations import models_dir  # noqa: E402
from peers.models.source import DEFAULT_MODEL  # noqa: E402
from peers.compute.cpu_linear import use_columns  # noqa: E402
from peers.compute.loading import load_config  # noqa: E402
from peers.compute.shard import Shard, Span  # noqa: E402


CLOCK = time.perf_counter


def median_ms(fn, repeats: int = 12) -> float:
    times = []
    for _ in range(repeats):
        t0 = CLOCK()
        fn()
        times.append((CLOCK() - t0) * 1e3)
    return statistics.median(times[2:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-positions", type=int, default=12)
    p.add_argument("--context", type=int, default=300, help="positions already in the cache (default 300)")
    p.add_argument("--threads", type=int, help="torch's CPU threads (default: its own choice)")
    p.add_argument("--cpu-time", action="store_true", help="the process's CPU time, not the wall clock")
    a = p.parse_args()
    global CLOCK
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.cpu_time:
        CLOCK = time.process_time
    model = models_dir() / DEFAULT_MODEL
    n = load_config(model).num_hidden_layers
    shard = Shard(model, Span(0, n, n), embed=True, head=True)
    s = shard.new_session()
    shard.forward([(s, 0, torch.arange(a.context)[None] + 100, None)])

    def forward(t: int) -> None:  # a pass of t positions after the context (each one trims the last away)
        (h,) = shard.forward([(s, a.context, torch.arange(t)[None] + 500, None)])
        shard.finish([(h[0], t)])
    print(f"forward of {model.name} with {a.context} positions cached, {torch.get_num_threads()} threads:")
    for t in range(1, a.max_positions + 1):
        print(f"  {t:2d} positions: {median_ms(lambda: forward(t)):6.1f} ms")
    lin = torch.nn.Linear(shard.config.hidden_size, shard.config.vocab_size, bias=False)
    for how in ("x @ W^T", "W @ x^T"):
        if how == "W @ x^T":
            use_columns(lin)
        with torch.inference_mode():
            row = [median_ms(lambda m=m: lin(torch.randn(1, m, lin.in_features)), 30) for m in range(1, 9)]
        print(f"the head's {lin.out_features}x{lin.in_features} product as {how}, 1-8 rows (ms): "
              + ", ".join(f"{x:.1f}" for x in row))


if __name__ == "__main__":
    main()
