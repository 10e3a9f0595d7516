"""The body of scripts/gpu_check (run that: it checks for a GPU, and unpacks carried wheels first).

Stages, in order of what matters, each within what is left of an 8-minute budget (a stage cut short or failed is
recorded, and the rest run):
- cuda_tests: the tests marked `cuda` (the ring exact on the GPU; graph replays equal eager passes for every
  (B, T) shape; a failed capture warns once; graphs captured, and none new past 600 positions; quantized spans;
  model drafts on the engine);
- a model of Qwen2.5-7B's shape with random weights (built on the GPU, nothing downloaded), through `sfchat bench`
  with two local peers: in bfloat16, transformers, ring and ring-spec at simulated acceptances 0.6 and 0.8
  (random weights have no real draft: a simulated one has a known acceptance) at 0, 86 and 175 ms; the ring at 0
  and 86 ms without CUDA graphs, where bench has --no-graphs; the same in NF4 (transformers runs no NF4 here);
- the 7B shape served to 2 and 4 clients at once (their rounds packed in graphed passes), an answer of 1,000
  tokens;
- the same model, ring-spec at 86 ms with simulated:0.6,0.6: the default policy's trees against --no-trees;
- the same model, ring-spec at 86 ms with simulated:0.8,0.6, host and members each on cores of their own (--pin):
  rounds in flight (the policy's, and 2 and 3 pinned) against one at a time, in one run;
- a model of SmolLM2-135M's shape in float32 drafting itself through the ring (acceptance >= 0.95: the
  machinery is exact), and in bfloat16 (the model draft on the engine, in the host's dtype).
Every bench row carries each member's memory and peak against what the plan counts for it, the CUDA graphs it
captured (asserted: every member of a graphed ring has some), and its milliseconds per pass at T=1 and T=K+1;
the 1,000-token answer's round times give their median and p99.
Each stage prints a JSON line as it ends; the last line printed is one JSON object of them all, with the checks.
"""
from __future__ import annotations

import argparse
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
SIMULATED = "simulated:0.6/0.8"
TREES = "simulated:0.6,0.6"
FLIGHT = "simulated:0.8,0.6"
KEEP = ("mode", "rtt_ms", "draft", "in_flight", "error", "tokens_per_second", "tokens_per_round", "acceptance",
        "compute_ms_per_round", "rounds_in_flight", "cancelled_share", "hedges_caught", "members", "pass_ms",
        "round_ms_all", "clients", "aggregate_tokens_per_second")


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
                          "--timeout", "120", *paths], 150)
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


def bench_has(flag: str) -> bool:
    code, out, _ = run([sys.executable, "-m", "sfchat", "bench", "--help"], 30)
    return code == 0 and flag in out


def bench(model: Path, out: Path, cap: float, *, dtype="bfloat16", quant="none", modes="transformers,ring,ring-spec",
          draft=SIMULATED, rtts="0,86,175", peers=2, extra=(), device="cuda") -> list[dict]:
    """`sfchat bench` on the GPU, one prompt, one run; its rows (those it finished, if it is cut short)."""
    code, _, err = run([sys.executable, "-m", "sfchat", "bench", "--model", str(model), "--dtype", dtype,
                        "--quant", quant, "--device", device, "--local-peers", str(peers), "--rtt-ms", rtts,
                        "--modes", modes, "--draft", draft, "--runs", "1", "--max-new-tokens", "32",
                        "--prompts", str(out.parent / "prompts.txt"), "--json", str(out), *extra], cap)
    rows = json.loads(out.read_text())["rows"] if out.is_file() else []  # written row by row
    if code != 0 and not rows:
        raise RuntimeError(err[-1500:])
    return [{k: r[k] for k in KEEP if k in r} for r in rows] + ([{"cut": f"exit {code}", "stderr": err[-800:]}]
                                                                 if code != 0 else [])


def trees_vs_chains(model: Path, work: Path) -> list[dict]:
    """ring-spec at 86 ms, simulated:0.6,0.6 (a second guess right 60% of the time where the first is wrong):
    the default policy's trees against chains (--no-trees)."""
    rows = []
    for extra in ((), ("--no-trees",)):
        got = bench(model, work / f"trees{len(extra)}.json", 90, modes="ring-spec", draft=TREES, rtts="86",
                    extra=(*extra, "--in-flight", "1"))
        rows += [r | {"trees": not extra} for r in got]
    return rows


def tok_s(rows, mode: str, rtt: float, draft: str | None = None, in_flight=None) -> float | None:
    for r in rows if isinstance(rows, list) else []:
        if (r.get("mode") == mode and r.get("rtt_ms") == rtt and r.get("draft") == draft and "error" not in r
                and r.get("in_flight") == in_flight):
            return r["tokens_per_second"]
    return None


def in_flight_gain(rows) -> dict:
    """Each --in-flight row's tokens/s over the same with one round at a time, at 86 ms."""
    name = "simulated acceptance 0.8, second guess 0.6"
    one = tok_s(rows, "ring-spec", 86.0, name, 1)
    return {str(n): round(t / one, 2) for n in ("auto", 2, 3) if one and (t := tok_s(rows, "ring-spec", 86.0, name, n))}


def summary(result: dict) -> dict:
    """The figures the GPU check is for: ring-spec at 86 ms (simulated 0.8) over ring there, bf16; the float32
    self-draft's acceptance."""
    bf16 = result.get("7b_bfloat16", [])
    spec, ring = tok_s(bf16, "ring-spec", 86.0, "simulated acceptance 0.8", 1), tok_s(bf16, "ring", 86.0)
    self_draft = [r for r in result.get("self_draft_float32", []) if isinstance(r, dict) and r.get("acceptance")]
    graphed = [r for r in bf16 + result.get("7b_clients_2_4", []) if isinstance(r, dict) and r.get("members")]
    members = [m for r in graphed for m in r["members"]]
    trees = {r.get("trees"): r.get("tokens_per_second") for r in result.get("7b_trees", [])
             if isinstance(r, dict) and "error" not in r}
    return {"spec_0.8_over_ring_at_86ms_bf16": round(spec / ring, 2) if spec and ring else None,
            "trees_over_chains_at_86ms_bf16": round(trees[True] / trees[False], 2)
            if trees.get(True) and trees.get(False) else None,
            "in_flight_over_one_at_86ms_bf16": in_flight_gain(result.get("7b_in_flight", [])) or None,
            "self_draft_acceptance": self_draft[0]["acceptance"] if self_draft else None,
            # every member of every graphed ring captured graphs, and none used more than its plan counts
            "graphs_on_every_member": bool(members) and all(m.get("graphs", 0) > 0 for m in members),
            "peak_over_planned": {m["name"]: round(m["peak_memory_bytes"] / m["planned_bytes"], 2)
                                  for m in members if m.get("planned_bytes")},
            "round_ms_1000_tokens": pass_times(result.get("7b_1000_tokens", []))}


def pass_times(rows) -> dict | None:
    """The median and p99 of a long answer's round times (the p99 within 1.5x the median: no re-captures)."""
    ms = sorted(t for r in rows if isinstance(r, dict) for t in r.get("round_ms_all") or [])
    if not ms:
        return None
    med, p99 = ms[len(ms) // 2], ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return {"rounds": len(ms), "median": round(med, 2), "p99": round(p99, 2), "p99_over_median": round(p99 / med, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tests", nargs="+", default=["tests/"],
                    help="where to collect the cuda tests (a machine without the test extras: tests/ring/test_cuda.py)")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: torch sees no CUDA device (this check measures on an NVIDIA GPU; nothing was run)")
        return 2
    result: dict = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "date": time.strftime("%Y-%m-%d")}
    stage(result, "cuda_tests", lambda: cuda_tests(args.tests))
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        (work / "prompts.txt").write_text("Explain pipeline parallelism in simple terms.\n")
        big = work / "qwen2.5-7b-shape"
        stage(result, "build_7b_shape", lambda: str(build_shape(big, "Qwen2Config", QWEN25_7B)))
        if "error" not in result["build_7b_shape"]:
            stage(result, "7b_bfloat16", lambda: bench(big, work / "bf16.json", 150, extra=["--in-flight", "1"]))
            stage(result, "7b_trees", lambda: trees_vs_chains(big, work))
            stage(result, "7b_in_flight", lambda: bench(big, work / "flight.json", 90, modes="ring-spec", draft=FLIGHT,
                                                        rtts="86", extra=["--pin", "--in-flight", "auto,2,3,1"]))
            if bench_has("--no-graphs"):
                stage(result, "7b_bfloat16_ring_no_graphs",
                      lambda: bench(big, work / "nographs.json", 50, modes="ring", rtts="0,86",
                                    extra=["--no-graphs"]))
            stage(result, "7b_clients_2_4", lambda: bench(big, work / "clients.json", 60, modes="", rtts="0",
                                                          extra=["--clients", "2,4"]))
            stage(result, "7b_1000_tokens", lambda: bench(big, work / "long.json", 60, modes="ring", rtts="0",
                                                          extra=["--max-new-tokens", "1000"]))
            stage(result, "7b_nf4", lambda: bench(big, work / "nf4.json", 110, quant="nf4", modes="ring,ring-spec"))
            shutil.rmtree(big)
        # the draft's speed depends on its shape, not its weights: SmolLM2-135M's shape, nothing downloaded
        small = work / "smollm2-135m-shape"
        stage(result, "build_135m_shape", lambda: str(build_shape(small, "LlamaConfig", SMOLLM2_135M)))
        if "error" not in result["build_135m_shape"]:
            stage(result, "self_draft_float32",
                  lambda: bench(small, work / "self.json", 60, dtype="float32", modes="ring-spec", draft=str(small),
                                rtts="0", peers=1))
            stage(result, "self_draft_bfloat16",
                  lambda: bench(small, work / "self16.json", 40, modes="ring-spec", draft=str(small), rtts="0",
                                peers=1))
    result["checks"] = summary(result)
    result["seconds"] = round(time.monotonic() - START, 1)
    print(json.dumps(result))
    checks = result["checks"]
    ok = result["cuda_tests"].get("ok") and checks["graphs_on_every_member"] is not False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
