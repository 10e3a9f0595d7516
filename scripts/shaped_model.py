"""A model folder of a real model's shape with random weights and the embedded default's tokenizer: what a CPU
benchmark of a larger model needs where no hub can be reached (docs/benchmarks.md). Random weights say nothing of
a model's answers, only of what its passes cost and how much memory they hold.

    python scripts/shaped_model.py OUT [--shape qwen2-1.5b] [--dtype bfloat16]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peers.base.locations import models_dir  # noqa: E402
from peers.models.source import DEFAULT_MODEL  # noqa: E402

# the published config's sizes; the vocabulary is the embedded default's, so its tokenizer fits
SHAPES = {
    "qwen2-1.5b": dict(hidden_size=1536, num_hidden_layers=28, intermediate_size=8960, num_attention_heads=12,
                       num_key_value_heads=2, tie_word_embeddings=True),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--shape", default="qwen2-1.5b", choices=sorted(SHAPES))
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = p.parse_args()
    tokenizer_from = models_dir() / DEFAULT_MODEL
    if not (tokenizer_from / "tokenizer.json").exists():
        sys.exit(f"no tokenizer at {tokenizer_from}: run `sfchat pull` first")
    vocab = json.loads((tokenizer_from / "config.json").read_text())["vocab_size"]
    config = Qwen2Config(vocab_size=vocab, max_position_embeddings=8192, **SHAPES[args.shape])
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, args.dtype))
    model.save_pretrained(args.out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tokenizer_from / name).exists():
            shutil.copy(tokenizer_from / name, args.out / name)
    n = sum(t.numel() for t in model.parameters())
    print(f"{args.out}: {args.shape}, {n / 1e9:.2f}B parameters in {args.dtype}")


if __name__ == "__main__":
    main()
