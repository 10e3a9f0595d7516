"""Memory per member for Qwen2.5-7B and -14B as peers/plan/layers.py computes it (the README's GPUs table).

`python scripts/plan_table.py [--context 8192]`: for rings of 1, 2 and 4 processes with plenty offered each, the
layers and bytes each process holds in bfloat16, NF4 and a CPU's int4, and the least memory that ring needs in all.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from tiny import qwen2_shapes  # noqa: E402

from peers.plan.layers import ModelSize, Offer, host_bytes, layer_bytes, pass_bytes, plan, ring_bytes
from peers.base.limits import size

MODELS = {  # name: layers, hidden, intermediate, heads, kv heads, vocab (their config.json)
    "Qwen2.5-7B": (28, 3584, 18944, 28, 4, 152064),
    "Qwen2.5-14B": (48, 5120, 13824, 40, 8, 152064),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=8192)
    args = ap.parse_args()
    print("| model | dtype | processes | layers each | memory each (host first) | ring needs |")
    print("|---|---|---|---|---|---|")
    for name, (n, h, i, heads, kv, vocab) in MODELS.items():
        config = {"num_hidden_layers": n, "hidden_size": h, "intermediate_size": i, "num_attention_heads": heads,
                  "num_key_value_heads": kv, "max_position_embeddings": 32768}
        m = ModelSize.of(config, qwen2_shapes(n, h, i, heads, kv, vocab))
        for quant in ("none", "nf4", "int4"):  # (int4: a CPU's, peers/compute/cpu_quant.py)
            for count in (1, 2, 4):
                offers = [Offer(f"p{j}", 10**15, "bfloat16", quant) for j in range(count)]
                spans = plan(m, offers, args.context)
                each = [s.size * layer_bytes(m, o, args.context) + pass_bytes(m, "bfloat16", args.context)
                        + (host_bytes(m, "bfloat16") if j == 0 else 0) for j, (s, o) in enumerate(zip(spans, offers))]
                kind = "bfloat16" + {"none": "", "nf4": " nf4", "int4": " int4 (CPU)"}[quant]
                print(f"| {name} | {kind} | {count} | {', '.join(str(s.size) for s in spans)} | "
                      f"{', '.join(size(b) for b in each)} | {size(ring_bytes(m, offers, args.context))} |")


if __name__ == "__main__":
    main()
