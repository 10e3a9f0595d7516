"""How well a draft earns its keep on chat prompts it never saw: tokens per round, acceptance and K (the host's
own adaptive choice), and its cost per drafted token against one full target forward, on this machine.

    python scripts/draft_eval.py [--draft D] [--max-new-tokens N] [--rtt-ms MS] [--json OUT]

One in-process host holding the whole model (no peers, no network: this measures the draft, not the ring). K is
the host's own choice as it would make it over a link of --rtt-ms (default 86, ShardFlow's): the policy is told
each round took that much longer than it did here; 0 gives the choice for a ring with no round trip, where on a
CPU each drafted token's verification costs a good part of a target forward and K stays small.
Each prompt is answered greedily twice, with the draft and with none; the answers must be identical (a draft
only changes speed), and the draft-less run's rounds give the cost of one target forward (one token).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peers.adaptive import KPolicy  # noqa: E402
from peers.chat import Chat  # noqa: E402
from peers.drafters import Drafter  # noqa: E402
from peers.sampling import SamplingParams  # noqa: E402
from sfchat.runtime import drafter_for, open_ring  # noqa: E402


class LinkPolicy(KPolicy):
    """The host's K policy as it would see rounds over a link that adds `rtt_ms` to every ring pass."""

    def __init__(self, rtt_ms: float):
        super().__init__()
        self.rtt_ms = rtt_ms

    def update(self, drafted, accepted, round_ms, positions=None):
        super().update(drafted, accepted, round_ms + self.rtt_ms, positions)


# chat prompts written for this check, not drawn from the distillation's templates or topics
PROMPTS = [
    "Explain quantum entanglement in simple terms.",
    "Write a Python function that computes Fibonacci numbers using dynamic programming.",
    "What are the advantages of pipeline parallelism?",
    "My tomato plants have yellow leaves. What could be wrong?",
    "Give me three tips for writing a good cover letter.",
    "How does a refrigerator keep food cold?",
    "Write a short poem about a lighthouse at night.",
    "What is the difference between a list and a tuple in Python?",
    "Plan a one-day itinerary for a first visit to Paris.",
    "Why do cats purr?",
]


async def run(args) -> dict:
    ns = argparse.Namespace(model=None, dtype="float32", quant="none", device="cpu", local_peers=0, draft=args.draft)
    rows = []
    async with open_ring(ns, announce=False) as ring:
        drafter = drafter_for(ns, ring)
        for prompt in PROMPTS:
            out = {}
            for name, d in (("draft", drafter), ("none", Drafter())):
                chat = Chat(ring.host, ring.tokenizer, ring.eos)
                _, r = await chat.reply(prompt, drafter=d, params=SamplingParams(), policy=LinkPolicy(args.rtt_ms),
                                        max_new_tokens=args.max_new_tokens)
                out[name] = r
            d, n = out["draft"], out["none"]
            if d.token_ids != n.token_ids:
                raise SystemExit(f"the draft changed the answer to {prompt!r}")
            s = d.stats.summary()
            rounds = d.rounds[1:]  # the first round is the prompt's prefill: no features to draft from yet
            rows.append({"prompt": prompt, "tokens": s["tokens"], "tokens_per_round": s["tokens_per_round"],
                         "acceptance": s["acceptance"] or 0.0, "mean_k": statistics.mean(r["k"] for r in rounds),
                         "draft_ms_per_token": sum(r["draft_ms"] + r["hidden_draft_ms"] for r in rounds)
                         / max(sum(r["drafted"] for r in rounds), 1),
                         "target_ms_per_forward": statistics.median(r["host_ms"] for r in n.rounds[1:])})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    med = {k: statistics.median(r[k] for r in rows) for k in
           ("tokens_per_round", "acceptance", "mean_k", "draft_ms_per_token", "target_ms_per_forward")}
    med["draft_cost_fraction"] = med["draft_ms_per_token"] / med["target_ms_per_forward"]
    return {"drafter": drafter.name, "rtt_ms": args.rtt_ms, "median": med, "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draft", help="the drafter (default: the shipped draft, else ngram)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--rtt-ms", type=float, default=86.0, help="the link K is chosen for (default 86)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    doc = trio.run(run, args)
    m = doc["median"]
    print(f"{doc['drafter']}, K chosen for {args.rtt_ms:g} ms: median over {len(doc['rows'])} prompts: "
          f"{m['tokens_per_round']:.2f} tokens/round, "
          f"acceptance {m['acceptance']:.3f}, K {m['mean_k']:.1f}, draft {m['draft_ms_per_token']:.2f} ms/token = "
          f"{100 * m['draft_cost_fraction']:.1f}% of a target forward ({m['target_ms_per_forward']:.1f} ms)")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
