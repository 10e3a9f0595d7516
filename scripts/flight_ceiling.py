"""The most that rounds in flight can gain on a ring, from a `sfchat bench --json` file's own pass costs, against
what its ring-spec rows with a simulated draft measured.

    python scripts/flight_ceiling.py bench.json

The model. A simulated draft (bench's `--draft simulated:A,S`) is right first with chance A and, where it is not,
second with chance S: a node's children are reached with chances A and (1 - A) * S. A round whose tree is the N
likeliest nodes then yields best(N) = 1 + the sum of their chances, in tokens. Each stage's pass over T positions
costs f + g * T ms (a line fitted to the pass_ms every row measured for that stage).
- One round at a time: a round of N nodes comes back after rtt + the sum over stages of f + g * N; its rate is
  best(N) / that, at the best N.
- Rounds in flight: a node's verdict still needs one trip, so the period is the same; what grows is the nodes in
  that period, at most as many positions as the busiest stage computes in it in passes of T. Tokens per
  period are at most best(those nodes): the likeliest tree, every node placed where it is likeliest to be used,
  no pass ever waiting for another. An upper bound, at the best T.
"""
from __future__ import annotations

import heapq
import json
import re
import sys
from collections import defaultdict

MAX_NODES = 256


def best(n: int, first: float, second: float) -> float:
    """Expected tokens of a round whose tree is the n likeliest nodes (the target's own token after them: +1)."""
    frontier, total = [-1.0], 0.0
    for _ in range(n + 1):  # the root (chance 1) is the committed token, not a node
        p = -heapq.heappop(frontier)
        total += p
        heapq.heappush(frontier, -p * first)
        heapq.heappush(frontier, -p * (1 - first) * second)
    return total


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares f + g * T through the (T, ms) points; one size seen: no slope."""
    ts = {t for t, _ in points}
    if len(ts) < 2:
        return sum(ms for _, ms in points) / len(points), 0.0
    mt, mm = sum(t for t, _ in points) / len(points), sum(ms for _, ms in points) / len(points)
    g = sum((t - mt) * (ms - mm) for t, ms in points) / sum((t - mt) ** 2 for t, _ in points)
    return mm - g * mt, max(g, 0.0)


def rates(rtt: float, stages: list[tuple[float, float]], first: float, second: float) -> tuple[float, float]:
    """tokens/s one round at a time (best N) and the ceiling with rounds in flight (best T)."""
    def trip(t: int) -> float:
        return rtt + sum(f + g * t for f, g in stages)

    one = max(best(n, first, second) / trip(n) for n in range(1, MAX_NODES))
    fly = max(best(min(MAX_NODES, int(trip(t) * t / max(f + g * t for f, g in stages))), first, second) / trip(t)
              for t in range(1, MAX_NODES))
    return one * 1e3, fly * 1e3


def main(path: str) -> None:
    rows = [r for r in json.load(open(path))["rows"] if "error" not in r]
    points = defaultdict(list)
    for r in rows:
        for name, by_size in (r.get("pass_ms") or {}).items():
            points[name] += [(int(k[2:]), ms) for k, ms in by_size.items()]
    stages = [fit(p) for p in points.values()]
    print("stage costs (ms):", ", ".join(f"{n} {f:.0f} + {g:.1f}/position" for n, (f, g) in zip(points, stages)))
    print("| RTT ms | draft | --in-flight | measured tok/s | model, one at a time | ceiling in flight "
          "| ceiling / one |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        m = re.fullmatch(r"simulated acceptance ([\d.]+)(?:, second guess ([\d.]+))?", r.get("draft") or "")
        if r["mode"] != "ring-spec" or not m:
            continue
        one, fly = rates(r["rtt_ms"], stages, float(m[1]), float(m[2] or 0))
        print(f"| {r['rtt_ms']:g} | {r['draft']} | {r.get('in_flight')} | {r['tokens_per_second']:.2f} | {one:.2f} "
              f"| {fly:.2f} | {fly / one:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1])
