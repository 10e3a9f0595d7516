"""llama.cpp's tokens/s on the same GGUF and prompts as `sfchat bench`, for docs/benchmarks.md (never in CI).

    pip install llama-cpp-python        # builds llama.cpp from source (minutes)
    python scripts/llama_cpp_rate.py GGUF [--threads 2] [--max-new-tokens 48] [--runs 1]

Each answer is greedy, rendered by the GGUF's own chat template, and counted as bench counts sfchat's: tokens
generated over the whole answer's wall time, the prompt's evaluation included; one warm-up answer first. The
tokens/s printed is their sum over the sum of seconds, per run, then the median of runs.
"""
from __future__ import annotations

import argparse
import ast
import statistics
import time
from pathlib import Path


def bench_prompts() -> list[str]:
    """bench's own three prompts, read from its source: llama-cpp-python's environment needs nothing of sfchat's."""
    tree = ast.parse((Path(__file__).resolve().parent.parent / "sfchat" / "bench.py").read_text())
    return next(ast.literal_eval(n.value) for n in tree.body
                if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "DEFAULT_PROMPTS")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("gguf")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--prompts", help="a file with one prompt per line (default: bench's three)")
    args = p.parse_args()
    from llama_cpp import Llama, __version__

    prompts = Path(args.prompts).read_text().splitlines() if args.prompts else bench_prompts()
    llm = Llama(args.gguf, n_threads=args.threads, n_ctx=2048, verbose=False)

    def answer(prompt: str, n: int) -> tuple[int, float]:
        t0 = time.perf_counter()
        out = llm.create_chat_completion([{"role": "user", "content": prompt}], max_tokens=n, temperature=0.0,
                                         top_k=1)
        return out["usage"]["completion_tokens"], time.perf_counter() - t0

    answer(prompts[0], 8)
    rates = []
    for _ in range(args.runs):
        done = [answer(q, args.max_new_tokens) for q in prompts]
        rates.append(sum(n for n, _ in done) / sum(s for _, s in done))
    print(f"llama-cpp-python {__version__}, {args.threads} threads: {statistics.median(rates):.2f} tok/s "
          f"(runs: {', '.join(f'{r:.2f}' for r in rates)})")


if __name__ == "__main__":
    main()
