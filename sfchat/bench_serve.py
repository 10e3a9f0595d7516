"""`sfchat bench --clients 1,2,4,8`: many clients at once on one ring, over the real HTTP endpoint.

Per RTT one ring (links shaped as in bench.py) serves the endpoint in this process's loop; for each number of
clients, that many streaming clients each send every prompt in turn (temperature 0), all at once. Aggregate
tokens/s = all answers' tokens / the wall time until the last one ends; per-client tokens/s = a client's tokens /
its own time (median over clients); time to first token = from sending a request to its first content chunk;
tokens per round = each conversation's tokens / its rounds (from the answers' `sfchat` stats), over all answers.
Each figure is the median over --runs.
"""
from __future__ import annotations

import json
import statistics
import time

import httpx
import trio

from .shaped_relay import shaped_relay

LEGEND = """
serving columns (--clients: that many streaming clients at once, each sending every prompt in turn):
  aggregate tok/s   every answer's tokens / the wall time until the last one ends (prefill included)
  per-client tok/s  a client's tokens / its own time, from its first request to its last answer's end
  tokens/round      each conversation's tokens / its rounds, over all answers
  TTFT p50, p95 ms  time to first token: from sending a request to its first content chunk"""


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)]


async def one_client(http: httpx.AsyncClient, model: str, prompts: list[str], max_new: int, out: dict) -> None:
    t_start, tokens = time.perf_counter(), 0
    for prompt in prompts:
        body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_new,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        t0, first = time.perf_counter(), None
        async with http.stream("POST", "/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                d = json.loads(line[6:])
                if first is None and d["choices"] and d["choices"][0]["delta"].get("content"):
                    first = time.perf_counter() - t0
                if d.get("usage"):
                    tokens += d["usage"]["completion_tokens"]
                if st := d.get("sfchat"):
                    out["rounds"].append((st["tokens_per_round"] * st["rounds"], st["rounds"]))
        out["ttft"].append((first if first is not None else time.perf_counter() - t0) * 1e3)
    out["tokens"].append(tokens)
    out["client_tps"].append(tokens / (time.perf_counter() - t_start))


async def clients_run(url: str, model: str, n: int, prompts: list[str], max_new: int) -> dict:
    out = {"ttft": [], "tokens": [], "client_tps": [], "rounds": []}
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(one_client, http, model, prompts, max_new, out)
        seconds = time.perf_counter() - t0
    rounds = sum(r for _, r in out["rounds"])
    return {"aggregate": sum(out["tokens"]) / seconds, "per_client": statistics.median(out["client_tps"]),
            "ttft": out["ttft"], "per_round": sum(t for t, _ in out["rounds"]) / rounds if rounds else 0.0}


async def serving_rows(args, rtt_ms: float, clients: list[int], prompts: list[str], advance,
                       local_cores: tuple = ()) -> list[dict]:
    from peers import HostOptions

    from .options import RingOptions
    from .runtime import new_drafter, open_ring
    from .serve.app import model_id
    from .serve.conversations import Conversations
    from .serve.server import serve_api

    rows = []
    async with shaped_relay(rtt_ms / (args.local_peers + 1)) as relay:
        opts = RingOptions(HostOptions(model=args.model, dtype=args.dtype, quant=args.quant, device=args.device,
                                       relay=relay, graphs=not args.no_graphs, conversations=max(clients),
                                       offer_gb=args.offer_gb, placement=args.placement),
                           local_peers=args.local_peers, local_cores=local_cores)
        advance(f"serving at {rtt_ms:g} ms: starting {args.local_peers} peer(s)")
        async with open_ring(opts, announce=False) as ring, trio.open_nursery() as nursery:
            conv = Conversations(ring.host, ring.tokenizer, ring.eos, await new_drafter(args.draft, ring),
                                 limit=max(clients))
            binds = await nursery.start(lambda task_status: serve_api(conv, "127.0.0.1:0", task_status=task_status))
            model = model_id(ring.host)
            advance(f"serving at {rtt_ms:g} ms: warm-up")
            await clients_run(binds[0], model, 1, prompts[:1], 8)
            for n in clients:
                runs = []
                for r in range(args.runs):
                    runs.append(await clients_run(binds[0], model, n, prompts, args.max_new_tokens))
                    advance(f"{n} client(s) at {rtt_ms:g} ms: run {r + 1}/{args.runs}", 1)
                ttft = [t for run in runs for t in run["ttft"]]
                rows.append({"clients": n, "rtt_ms": rtt_ms,
                             "aggregate_tokens_per_second": round(statistics.median(x["aggregate"] for x in runs), 3),
                             "per_client_tokens_per_second": round(statistics.median(x["per_client"] for x in runs),
                                                                   3),
                             "tokens_per_round": round(statistics.median(x["per_round"] for x in runs), 2),
                             "ttft_ms_p50": round(percentile(ttft, 0.5), 1),
                             "ttft_ms_p95": round(percentile(ttft, 0.95), 1), "runs": args.runs,
                             "layers": {m["name"]: m["layers"] for m in ring.host.members_info()}})
            nursery.cancel_scope.cancel()
    return rows


def checks(rows: list[dict]) -> list[str]:
    """Aggregate throughput of n clients against one, at each RTT (informational)."""
    at = {(r["clients"], r["rtt_ms"]): r["aggregate_tokens_per_second"] for r in rows}
    return [f"at {rtt:g} ms: {n} clients reach {tps / at[(1, rtt)]:.2f}x the aggregate tokens/s of 1"
            for (n, rtt), tps in sorted(at.items(), key=lambda kv: (kv[0][1], kv[0][0])) if n > 1 and (1, rtt) in at]


def print_table(rows: list[dict], console) -> None:
    from rich.table import Table

    t = Table(title="serving: concurrent clients over HTTP")
    for col in ("RTT ms", "clients", "aggregate tok/s", "per-client tok/s", "tokens/round", "TTFT p50 ms", "TTFT p95 ms"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(f"{r['rtt_ms']:g}", str(r["clients"]), f"{r['aggregate_tokens_per_second']:.2f}",
                  f"{r['per_client_tokens_per_second']:.2f}", f"{r['tokens_per_round']:.2f}", f"{r['ttft_ms_p50']:.0f}",
                  f"{r['ttft_ms_p95']:.0f}")
    console.print(t)
