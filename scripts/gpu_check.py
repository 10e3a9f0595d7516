"""The body of scripts/gpu_check (run that: it checks for a GPU and a CUDA build of torch first).

Stages, each with what is left of an 8-minute budget: the tests marked `cuda`; a model of Qwen2.5-7B's shape with
random weights (built on the GPU, nothing downloaded) through `sfchat bench` in bfloat16 and in NF4 with two local
peers at 0 and 86 ms (transformers on the same GPU and dtype, ring, ring-spec with the target drafting itself),
peak memory per member; the CUDA-graph draft against eager, on a model of SmolLM2-135M's shape. A stage that fails
is recorded, and the rest run.
Each stage prints a JSON line as it ends; the last line printed is one JSON object of them all.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUDGET_S = 480
START = time.monotonic()
QWEN25_7B = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                 num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768, rope_theta=1e6,
                 rms_norm_eps=1e-6, tie_word_embeddings=False)
SMOLLM2_135M = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192, rope_theta=1e5,
                    rms_norm_eps=1e-5, tie_word_embeddings=True)


def left(cap: float) -> float:
    return max(min(cap, BUDGET_S - (time.monotonic() - START)), 1.0)


def run(cmd: list[str], cap: float) -> tuple[int | None, str, str]:
    """Exit status (None: killed at its cap), stdout and stderr; what it printed is kept even when it is killed."""
    print("$", " ".join(cmd), file=sys.stderr, flush=True)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, text=True)
        try:
            code = p.wait(timeout=left(cap))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            code = None
        out.seek(0)
        err.seek(0)
        return code, out.read(), err.read()


def stage(result: dict, name: str, fn) -> None:
    t0 = time.monotonic()
    try:
        result[name] = fn()
    except Exception as e:  # one stage's failure must not hide the others' figures
        result[name] = {"error": f"{type(e).__name__}: {e}"[-2000:]}
    print(f"{name}: {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    print(json.dumps({name: result[name]}), flush=True)  # each stage as it ends, in case the whole is cut short


def cuda_tests(paths: list[str]) -> dict:
    # pytest-timeout's backstop prints every thread's stack where a test is stuck
    code, out, err = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda",
                          "--timeout", "120", *paths], 240)
    lines = out.strip().splitlines()
    return {"ok": code == 0, "summary": lines[-1] if lines else err[-500:],
            **({"output": out[-6000:]} if code != 0 else {})}


def build_shape(path: Path, config_class: str, shape: dict) -> Path:
    """A model of this shape, random weights initialised on the GPU and saved in bfloat16, with a small tokenizer."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(ROOT / "tests"))
    from tiny import make_tokenizer

    tok = make_tokenizer()
    cfg = getattr(transformers, config_class)(**shape, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                              pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    del model
    torch.cuda.empty_cache()
    return path


def bench(model: Path, quant: str, prompts: Path, out: Path) -> list[dict]:
    code, _, err = run([sys.executable, "-m", "sfchat", "bench", "--model", str(model), "--dtype", "bfloat16",
                        "--quant", quant, "--device", "cuda", "--local-peers", "2", "--rtt-ms", "0,86",
                        "--modes", "transformers,ring,ring-spec", "--draft", str(model), "--runs", "1",
                        "--max-new-tokens", "32", "--prompts", str(prompts), "--json", str(out)], 170)
    if code != 0:
        raise RuntimeError(err[-1500:])
    keep = ("mode", "rtt_ms", "tokens_per_second", "tokens_per_round", "acceptance", "members")
    return [{k: r[k] for k in keep if k in r} for r in json.loads(out.read_text())["rows"]]


def draft_graphs(model: Path) -> list[dict]:
    code, out, err = run([sys.executable, "scripts/gpu_draft_bench.py", "--model", str(model), "--tokens", "128"],
                         120)
    if code != 0:
        raise RuntimeError(err[-1500:])
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main() -> int:
    import argparse

    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--tests", nargs="+", default=["tests/"],
                    help="where to collect the cuda tests (a machine without the test extras: tests/test_cuda.py)")
    args = ap.parse_args()

    if not torch.cuda.is_available():
        print("gpu_check: torch sees no CUDA device")
        return 2
    result: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    stage(result, "cuda_tests", lambda: cuda_tests(args.tests))
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        prompts = work / "prompts.txt"
        prompts.write_text("Explain pipeline parallelism in simple terms.\n")
        big = work / "qwen2.5-7b-shape"
        stage(result, "build_7b_shape", lambda: str(build_shape(big, "Qwen2Config", QWEN25_7B)))
        if "error" not in result["build_7b_shape"]:
            for quant in ("none", "nf4"):
                stage(result, f"7b_bfloat16_{quant}",
                      lambda q=quant: bench(big, q, prompts, work / f"bench-{q}.json"))
            shutil.rmtree(big)
        # the draft's speed depends on its shape, not its weights: SmolLM2-135M's shape, nothing downloaded
        draft = work / "smollm2-135m-shape"
        stage(result, "draft_cuda_graphs_vs_eager",
              lambda: draft_graphs(build_shape(draft, "LlamaConfig", SMOLLM2_135M)))
    result["seconds"] = round(time.monotonic() - START, 1)
    print(json.dumps(result))
    return 0 if result["cuda_tests"].get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
