"""Running the real CLI and plain transformers side by side."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent


def sfchat(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "sfchat", *args], capture_output=True, text=True, timeout=timeout,
                       env=env, cwd=ROOT)
    if check and p.returncode != 0:
        raise AssertionError(f"sfchat {' '.join(args)} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return p


def ask_json(prompt: str, *args: str, timeout: float = 300) -> dict:
    p = sfchat("ask", prompt, "--json", *args, timeout=timeout)
    return json.loads(p.stdout.strip().splitlines()[-1])


def reference_ids(model_dir: Path, prompt: str, max_new_tokens: int) -> list[int]:
    """Plain transformers generate, greedy, on the same weights and the same chat-templated prompt."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                  return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, ids.shape[1]:].tolist()
