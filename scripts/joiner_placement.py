"""Placement as a user meets it on one box: a host and a joiner started with `--threads 1`, a busy program beside
them, the same prompts answered in turn under each placement (alternating); each answer's tok/s (its new tokens
over its wall time), each run's median, and where the layers went after each answer.

    python scripts/joiner_placement.py [--order speed,memory,speed,memory] [--max-new-tokens 48] [--no-busy]

The host answers as `sfchat ask` would (its options, with --listen and --wait-peers 1), six prompts in one
process, so that re-plans between answers happen as in `sfchat host`.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["Write a short story about a lighthouse keeper.", "Explain how a bicycle stays upright.",
           "List five uses for a paperclip, one line each.", "Describe the water cycle for a child.",
           "What makes a good cup of tea?", "Give three tips for learning to juggle."]


async def host(argv: list[str]) -> None:
    """The host's side: one JSON line after each answer, then one with every answer's tok/s."""
    import trio

    from peers import Chat, KPolicy
    from sfchat.cli import parser
    from sfchat.options import ring_options
    from sfchat.runtime import new_drafter, open_ring

    opts = ring_options(parser().parse_args(["ask", "", *argv]))
    async with open_ring(opts) as ring:
        drafter = await new_drafter(opts.answer.draft, ring)
        rates = []
        for prompt in PROMPTS:
            chat = Chat(ring.host, ring.tokenizer, ring.eos)
            t0 = time.perf_counter()
            _, r = await chat.reply(prompt, drafter=drafter, params=opts.answer.sampling(),
                                    policy=opts.answer.pin(KPolicy()), max_new_tokens=opts.answer.max_new_tokens)
            rates.append(len(r.token_ids) / (time.perf_counter() - t0))
            await ring.host.drop(chat.rs)
            members = [(m["name"], m["layers"] or "none", m["ms_per_layer"]) for m in ring.host.members_info()]
            print(json.dumps({"tok_s": round(rates[-1], 2), "members": members}), flush=True)
        print(json.dumps({"rates": [round(x, 2) for x in rates]}), flush=True)


def run(placement: str, port: int, tokens: int, log_dir: Path) -> list[dict]:
    env = dict(os.environ, SFCHAT_NO_PATH_HINT="1", PYTHONPATH=str(ROOT))  # this checkout's sfchat, in both
    py = [sys.executable, "-P"]
    with open(log_dir / f"host-{placement}-{port}.log", "w") as hl, open(log_dir / f"join-{placement}-{port}.log",
                                                                            "w") as jl:
        h = subprocess.Popen([*py, __file__, "--as-host", "--placement", placement, "--listen", f"127.0.0.1:{port}",
                              "--token", "joiner-placement", "--wait-peers", "1", "--max-new-tokens", str(tokens)],
                             env=env, stdout=subprocess.PIPE, stderr=hl, text=True, start_new_session=True)
        time.sleep(5)  # the host times itself first, alone
        j = subprocess.Popen([*py, "-m", "sfchat", "join", f"127.0.0.1:{port}", "--token", "joiner-placement",
                              "--threads", "1", "--name", "joiner"], env=env, stdout=jl, stderr=subprocess.STDOUT,
                             cwd=ROOT, start_new_session=True)
        lines = []
        try:
            for line in h.stdout:
                lines.append(json.loads(line))
                if "rates" in lines[-1]:
                    break
        finally:
            for p in (j, h):
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGINT)
            for p in (j, h):
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--order", default="speed,memory,speed,memory")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--no-busy", action="store_true", help="no busy program beside")
    ap.add_argument("--logs", default="joiner-placement-logs", help="the host's and joiner's logs go here")
    a = ap.parse_args()
    log_dir = Path(a.logs)
    log_dir.mkdir(exist_ok=True)
    busy = None if a.no_busy else subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        for i, placement in enumerate(a.order.split(",")):
            lines = run(placement, 18700 + 10 * i, a.max_new_tokens, log_dir)
            rates = lines[-1]["rates"] if lines and "rates" in lines[-1] else []
            print(json.dumps({"placement": placement, "median_tok_s": round(statistics.median(rates), 2) if rates
                              else None, "rates": rates, "layers": [x["members"] for x in lines if "members" in x],
                              "at": time.strftime("%H:%M:%S")}), flush=True)
    finally:
        if busy is not None:
            busy.kill()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--as-host"]:
        import logging

        import trio

        sys.path.insert(0, str(ROOT))
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")  # plans and re-plans
        logging.getLogger("httpx").setLevel(logging.WARNING)
        trio.run(host, sys.argv[2:])
    else:
        main()
