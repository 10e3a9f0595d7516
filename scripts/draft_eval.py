"""How well a draft earns its keep on chat prompts it never saw: tokens per round, acceptance and K (the host's
own adaptive choice), and its cost per drafted token against one full target forward, on this machine.

    python scripts/draft_eval.py [--draft D] [--max-new-tokens N] [--rtt-ms MS] [--one-k | --chain] [--json OUT]

One in-process host holding the whole model (no peers, no network: this measures the draft, not the ring). K is
the host's own choice as it would make it over a link of --rtt-ms (default 86, ShardFlow's): the policy is told
each round took that much longer than it did here; 0 gives the choice for a ring with no round trip, where on a
CPU each drafted token's verification costs a good part of a target forward and K stays small. A draft that knows
its confidence drafts a tree in greedy rounds (peers/speculation/tree.py): K is then the tree's size, and acceptance the share
of its nodes accepted (of siblings at most one can be); `--chain` drafts chains instead.
Each prompt is answered greedily twice, with the draft and with none; the answers must be identical (a draft
only changes speed), and the draft-less run's rounds give the cost of one target forward (one token).

The draft's cost is given two ways: its time per draft the ring verified (what a round pays for each) and per
token it computed (its own speed: with a confidence floor a round also computes the first token below the floor,
which only a ring's look-ahead uses). speedup_over_link: tokens/s with the draft over tokens/s without, both
with rtt_ms added to every round, in this same run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peers.speculation.adaptive import LinkPolicy  # noqa: E402
from peers.conversation.chat import Chat  # noqa: E402
from peers.speculation.drafting import Drafter  # noqa: E402
from peers.base.options import HostOptions  # noqa: E402
from peers.speculation.sampling import SamplingParams  # noqa: E402
from sfchat.options import RingOptions  # noqa: E402
from sfchat.runtime import new_drafter, open_ring  # noqa: E402


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


def over_link(result, rtt_ms: float) -> float:
    """Tokens per second had every round (prefill excluded) also crossed a link of rtt_ms."""
    rounds = result.rounds[1:]
    return sum(r["committed"] for r in rounds) * 1e3 / sum(r["round_ms"] + rtt_ms for r in rounds)


async def run(args) -> dict:
    opts = RingOptions(HostOptions(dtype="float32", device="cpu"))
    rows = []
    async with open_ring(opts, announce=False) as ring:
        drafter = new_drafter(args.draft, ring)
        if args.one_k:
            drafter.confident = False  # the policy then picks one K per round, as for any drafter
        if args.chain:
            drafter.trees = False  # a chain of drafts, its length by confidence
        for prompt in PROMPTS:
            out = {}
            made, spent = drafter.tokens_made, drafter.ms_spent
            for name, d in (("draft", drafter), ("none", Drafter())):
                chat = Chat(ring.host, ring.tokenizer, ring.eos)
                _, r = await chat.reply(prompt, drafter=d, params=SamplingParams(), policy=LinkPolicy(args.rtt_ms),
                                        max_new_tokens=args.max_new_tokens)
                out[name] = r
            made, spent = drafter.tokens_made - made, drafter.ms_spent - spent
            d, n = out["draft"], out["none"]
            if d.token_ids != n.token_ids:
                raise SystemExit(f"the draft changed the answer to {prompt!r}")
            s = d.stats.summary()
            rounds = d.rounds[1:]  # the first round is the prompt's prefill: no features to draft from yet
            rows.append({"prompt": prompt, "tokens": s["tokens"], "tokens_per_round": s["tokens_per_round"],
                         "acceptance": s["acceptance"] or 0.0, "mean_k": statistics.mean(r["k"] for r in rounds),
                         "draft_ms_per_token": sum(r["draft_ms"] + r["hidden_draft_ms"] for r in rounds)
                         / max(sum(r["drafted"] for r in rounds), 1),
                         "draft_ms_per_computed_token": spent / max(made, 1),
                         "target_ms_per_forward": statistics.median(r["host_ms"] for r in n.rounds[1:]),
                         "speedup_over_link": over_link(d, args.rtt_ms) / over_link(n, args.rtt_ms)})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    med = {k: statistics.median(r[k] for r in rows) for k in
           ("tokens_per_round", "acceptance", "mean_k", "draft_ms_per_token", "draft_ms_per_computed_token",
            "target_ms_per_forward", "speedup_over_link")}
    med["draft_cost_fraction"] = med["draft_ms_per_token"] / med["target_ms_per_forward"]
    med["computed_cost_fraction"] = med["draft_ms_per_computed_token"] / med["target_ms_per_forward"]
    return {"drafter": drafter.name, "rtt_ms": args.rtt_ms, "median": med, "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--draft", help="the drafter (default: the shipped draft, else ngram)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--rtt-ms", type=float, default=86.0, help="the link K is chosen for (default 86)")
    p.add_argument("--one-k", action="store_true",
                   help="one K per round even for a draft that reports its confidence (to compare)")
    p.add_argument("--chain", action="store_true", help="drafts in a chain, not a tree (to compare)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    doc = trio.run(run, args)
    m = doc["median"]
    print(f"{doc['drafter']}, K chosen for {args.rtt_ms:g} ms: median over {len(doc['rows'])} prompts: "
          f"{m['tokens_per_round']:.2f} tokens/round, "
          f"acceptance {m['acceptance']:.3f}, K {m['mean_k']:.1f}, draft {m['draft_ms_per_token']:.2f} ms per "
          f"verified draft = {100 * m['draft_cost_fraction']:.1f}% of a target forward "
          f"({m['target_ms_per_forward']:.1f} ms), {m['draft_ms_per_computed_token']:.2f} ms per token computed = "
          f"{100 * m['computed_cost_fraction']:.1f}%; {m['speedup_over_link']:.2f}x no draft over the link")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
