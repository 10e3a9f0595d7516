"""Replay a distilled draft offline on the target's own greedy answers: how sure it is against how often it is
right (and the temperature SHARPEN that calibrates it), how copying and the draft compare, and how many tokens a
round would commit with a fixed K, with the confidence floor of peers/speculation/adaptive.py as a chain, or as a tree.

    python scripts/draft_replay.py [--draft D] [--prompts eval|heldout] [--json OUT]

The target answers each prompt (greedy, --max-new-tokens) and its final hidden states are computed once; then,
at every answer position, the draft proposes from the target's real features as at the start of a round.
Rounds are replayed back to back (each starts where the last one's accepted tokens and the target's own token
end). Tokens/s is modelled: a round costs --base-ms (the round trip and one token's pass) plus, per verified
position, --verify-ms and --draft-ms (defaults: this project's 2-core Xeon at 86 ms). `eval`: draft_eval.py's
ten prompts; `heldout`: 30 chat prompts from the distillation's held-out subjects (what COPY_WEIGHT and SHARPEN
were fitted on).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from draft_eval import PROMPTS  # noqa: E402
from peers.speculation.drafting import feature, shipped_draft  # noqa: E402
from peers.distill import chat_prompts  # noqa: E402
from peers.speculation.drafting import lookup  # noqa: E402
from peers.base.locations import models_dir  # noqa: E402
from peers.models.source import DEFAULT_MODEL  # noqa: E402
from peers.speculation.sampling import SamplingParams  # noqa: E402
from peers.base.limits import MAX_NODES  # noqa: E402

FLOORS = (0.05, 0.08, 0.12, 0.2)
DEPTH = 12
TEMPERATURES = (1.0, 0.9, 0.85, 0.8, 0.7)


def log_loss(d, logits: torch.Tensor, copy: int | None, truth: int, temperature: float) -> float:
    """-log of the chance given to what happened, "child is the target's token" or not, over the top 3 children
    under the draft's logits / temperature (the copy mixed in)."""
    kids = d._children(torch.softmax(logits / temperature, -1), copy, 3)
    return sum(-math.log(max(p if t == truth else 1 - p, 1e-6)) for t, p in kids)


def answers(model, tok, prompts: list[str], max_new: int):
    """(prompt length, the whole sequence, the target's final normalised hidden states) per prompt."""
    for p in prompts:
        ids = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if not isinstance(ids, list) else ids)
        with torch.no_grad():
            full = model.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False)[0].tolist()
            yield len(ids), full, model.model(torch.tensor([full])).last_hidden_state[0]


def replay(rows: list[dict], commit, cost) -> tuple[float, float]:
    """Rounds back to back over each answer: (tokens per round, modelled tokens/s)."""
    tokens = rounds = ms = 0.0
    for answer in rows:
        at = {r["m"]: r for r in answer}
        m = answer[0]["m"]
        while m in at:
            accepted, verified = commit(at[m])
            accepted = min(accepted, at[m]["left"] - 1)
            tokens, rounds, ms = tokens + accepted + 1, rounds + 1, ms + cost(verified)
            m += accepted + 1
    return tokens / rounds, 1e3 * tokens / ms


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", type=Path, help="a distilled draft (default: the shipped one)")
    ap.add_argument("--prompts", choices=("eval", "heldout"), default="eval")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--base-ms", type=float, default=145.0)
    ap.add_argument("--verify-ms", type=float, default=4.5)
    ap.add_argument("--draft-ms", type=float, default=3.7)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    torch.set_num_threads(1)
    target = models_dir() / DEFAULT_MODEL
    tok, model = AutoTokenizer.from_pretrained(target), AutoModelForCausalLM.from_pretrained(target).eval()
    d = feature.load(a.draft or shipped_draft(target), target, tok, model.config.vocab_size)
    rng = random.Random(1)
    prompts = PROMPTS if a.prompts == "eval" else [chat_prompts.prompt(rng, "eval") for _ in range(30)]
    losses = dict.fromkeys(TEMPERATURES, 0.0)
    rows, firsts = [], []  # per answer: one row per position; per position: (truth, draft top, p, copy, p copy)
    for start, full, feats in answers(model, tok, prompts, a.max_new_tokens):
        d.observe(0, full, feats)
        answer = []
        with torch.no_grad():
            g = d.model(torch.tensor([full[1:]]), feats[None, :-1])[0]  # index t predicts x_{t+2}
            logits = d.model.head(g).float()
            first = d._probs(logits)
        for m in range(start + 1, len(full)):
            chain, _ = d.propose(full[:m], DEPTH, SamplingParams())
            ok = next((i for i, t in enumerate(chain) if m + i >= len(full) or t != full[m + i]), len(chain))
            sure = list(d.confidence)
            t = d.propose_tree(full[:m], FLOORS[0], DEPTH, MAX_NODES)
            answer.append({"m": m, "left": len(full) - m, "ok": ok, "sure": sure,
                           "tree": [(s, t.path(i)) for i, s in enumerate(t.sure)], "truth": full[m : m + DEPTH + 1]})
            p, copy = first[m - 2], lookup(full[:m], 1)
            for temp in TEMPERATURES:
                losses[temp] += log_loss(d, logits[m - 2], copy[0] if copy else None, full[m], temp)
            row = d.to_row.get(copy[0]) if copy else None
            firsts.append((full[m], int(d.to_target[p.argmax()]), float(p.max()), copy[0] if copy else None,
                           float(p[row]) if row is not None else 0.0))
        rows.append(answer)
        print(f"{len(rows)}/{len(prompts)}", file=sys.stderr, flush=True)

    out = {"prompts": a.prompts, "positions": len(firsts)}
    # calibration: each draft of a chain whose drafts before it were all right, by its own confidence
    bins = [[0, 0] for _ in range(10)]
    for r in (r for answer in rows for r in answer):
        prev = 1.0
        for i, s in enumerate(r["sure"][: r["ok"] + 1]):
            b = bins[min(int(s / prev * 10), 9)]
            b[0], b[1], prev = b[0] + 1, b[1] + (i < r["ok"]), s
    out["log_loss_by_temperature"] = {t: round(v / len(firsts), 4) for t, v in losses.items()}
    out["calibration"] = {f"{i / 10:.1f}-{(i + 1) / 10:.1f}": {"drafts": n, "right": round(k / n, 3)}
                          for i, (n, k) in enumerate(bins) if n}
    # copying against the draft at a round's first draft, where the text repeats
    cp = [f for f in firsts if f[3] is not None]
    agree = [f for f in cp if f[1] == f[3]]
    differ = [f for f in cp if f[1] != f[3]]
    rate = lambda fs, i: round(sum(f[0] == f[i] for f in fs) / max(len(fs), 1), 3)  # noqa: E731
    out["copy"] = {"share_of_positions": round(len(cp) / len(firsts), 3), "copy_right": rate(cp, 3),
                   "draft_right": rate(cp, 1), "agree_share": round(len(agree) / max(len(cp), 1), 3),
                   "right_where_they_agree": rate(agree, 3), "copy_right_where_they_differ": rate(differ, 3),
                   "draft_right_where_they_differ": rate(differ, 1),
                   "mixture_right": {w: round(sum(f[0] == (f[1] if (1 - w) * f[2] > w + (1 - w) * f[4] else f[3])
                                                  for f in cp) / max(len(cp), 1), 3) for w in (0.3, 0.4, 0.5, 0.6)}}
    cost = lambda verified: a.base_ms + verified * (a.verify_ms + a.draft_ms)  # noqa: E731
    out["fixed_k"] = {k: replay(rows, lambda r, k=k: (min(r["ok"], k), k), cost) for k in range(1, 7)}
    out["chain_floor"] = {f: replay(rows, lambda r, f=f: (min(r["ok"], n := sum(s >= f for s in r["sure"])), n),
                                    cost) for f in FLOORS}

    def tree_commit(r, f):
        paths = {tuple(p) for s, p in r["tree"] if s >= f}
        n = 0
        while tuple(r["truth"][: n + 1]) in paths and n < len(r["truth"]) - 1:
            n += 1
        return n, len(paths)
    out["tree"] = {f: replay(rows, lambda r, f=f: tree_commit(r, f), cost) for f in FLOORS}
    out["median_tree_prompt"] = {f: statistics.median(replay([ans], lambda r, f=f: tree_commit(r, f), cost)[0]
                                                      for ans in rows) for f in FLOORS}
    print(json.dumps(out, indent=1))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
