"""What attention that gives a row the same bits in any pass (peers/compute/invariant.py) costs a CPU pass of the
embedded target in the defaults (bfloat16, int4), against transformers' own sdpa call, by the pass's shape:
one process, all 30 layers, the two computations alternating (docs/benchmarks.md, "Answers that repeat").

    python scripts/invariance_cost.py [--context N] [--repeats N] [--threads N]

Times are the process's CPU time, the fastest and the median of the repeats: on a machine other work shares, the
fastest is the steadier figure (and one thread spins less while it waits than two).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from peers.base.locations import models_dir
from peers.compute.shard import Shard, Span
from peers.models.source import DEFAULT_MODEL

SHAPES = {  # name -> (positions, parents): what a ring's passes carry
    "1 token": (1, []),
    "chain of 4": (4, [-1, 0, 1]),
    "tree of 8 (3 side paths)": (8, [-1, 0, 1, 2, 0, 4, -1, 1]),
    "prefill of 64": (64, []),
    "prefill of 256": (256, []),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=200, help="positions already in the cache (default 200)")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    shard = Shard(models_dir() / DEFAULT_MODEL, Span(0, 30, 30), embed=True, head=True, dtype="bfloat16",
                  quant="int4", context=2048)
    s = shard.new_session()
    ids = torch.randint(100, 5000, (1, a.context + 256))
    shard.forward([(s, 0, ids[:, : a.context], [])])
    print(f"SmolLM2-135M, bfloat16 + int4, one process, {a.threads} threads, {a.context} positions before the pass")
    print(f"{'pass':28} {'sdpa ms (fastest, median)':>26} {'invariant ms':>20} {'ratio of fastest':>17}")
    for name, (t, parents) in SHAPES.items():
        x = ids[:, a.context : a.context + t]
        times = {False: [], True: []}
        for _ in range(a.repeats):
            for inv in (False, True):
                shard.invariant = inv
                t0 = time.process_time()
                shard.forward([(s, a.context, x, parents)])
                times[inv].append((time.process_time() - t0) * 1e3)
        b, n = times[False], times[True]
        print(f"{name:28} {min(b):12.2f} {statistics.median(b):12.2f} {min(n):9.2f} {statistics.median(n):10.2f} "
              f"{min(n) / min(b):17.3f}", flush=True)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
