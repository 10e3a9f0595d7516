"""`sfchat bench`: tokens/s of plain transformers and of the ring, over links shaped to a given round-trip time.

Modes: `transformers` (plain generate, one process: the compute ceiling), `transformers-assisted` (its own
assisted generation with the same draft), `ring` (no speculation) and `ring-spec`. Each RTT above 0 puts a
shaping relay under the ring, its one-way delay being RTT / (ring links), so one pass around the ring (host ->
member 1 -> … -> host) adds exactly that RTT. One ring per RTT serves every prompt and run, warmed up first.

A row's ceiling is tokens per round / (RTT + measured compute per round): what the mode would reach if the
network cost only its RTT and nothing but compute ran in between.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field

import trio

DEFAULT_PROMPTS = [
    "Explain quantum entanglement in simple terms.",
    "Write a Python function that computes Fibonacci numbers using dynamic programming.",
    "What are the advantages of pipeline parallelism?",
]
MODES = ["transformers", "transformers-assisted", "ring", "ring-spec"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft", help="default: the shipped draft for the embedded default, else ngram; or ngram, none, "
                   "a draft model or a distilled draft (smollm2-135m drafting itself is an upper bound)")
    p.add_argument("--k", type=int, help="pin the draft length (default: adaptive)")
    p.add_argument("--local-peers", type=int, default=1, metavar="N", help="peer processes in the ring (default 1)")
    p.add_argument("--rtt-ms", default="0,20,86,175", help="comma-separated ring round-trip times to emulate")
    p.add_argument("--prompts", help="a file with one prompt per line (default: three built-in prompts)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=3, help="timed runs of every prompt per mode; tokens/s is their median")
    p.add_argument("--modes", help="a subset of " + ",".join(MODES) + " (default: all, or none with --clients)")
    p.add_argument("--clients", metavar="N,N…", help="also serve the endpoint and measure this many concurrent "
                   "clients over HTTP (aggregate and per-client tokens/s, time to first token); e.g. 1,2,4,8")
    p.add_argument("--json", metavar="OUT", help="also write the results to this JSON file")


@dataclass
class Sample:
    """One mode's generations over all prompts of one run, and their rounds."""

    tokens: int = 0
    seconds: float = 0.0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    compute_ms: float = 0.0  # summed over rounds: forward passes, drafting on the critical path, verification
    network_ms: float = 0.0

    def add(self, other: "Sample") -> None:
        for k in self.__dataclass_fields__:
            setattr(self, k, getattr(self, k) + getattr(other, k))


@dataclass
class Row:
    mode: str
    rtt_ms: float
    runs: list[Sample] = field(default_factory=list)
    members: list[dict] = field(default_factory=list)  # a ring's members and their memory after the runs

    def to_dict(self) -> dict:
        total = Sample()
        for s in self.runs:
            total.add(s)
        tps = statistics.median(s.tokens / s.seconds for s in self.runs if s.seconds)
        tpr = total.tokens / total.rounds if total.rounds else 0.0
        compute = total.compute_ms / total.rounds if total.rounds else 0.0
        rtt = self.rtt_ms if self.mode.startswith("ring") else 0.0  # one process: no network in its rounds
        ceiling = tpr / ((rtt + compute) / 1e3) if rtt + compute > 0 else None
        return {"mode": self.mode, "rtt_ms": self.rtt_ms, "tokens_per_second": round(tps, 3),
                "tokens_per_second_runs": [round(s.tokens / s.seconds, 3) for s in self.runs],
                "tokens_per_round": round(tpr, 3),
                "acceptance": round(total.accepted / total.drafted, 4) if total.drafted else None,
                "compute_ms_per_round": round(compute, 3),
                "network_ms_per_round": round(total.network_ms / total.rounds, 3) if total.rounds else None,
                "ceiling_tokens_per_second": round(ceiling, 3) if ceiling else None,
                "fraction_of_ceiling": round(tps / ceiling, 4) if ceiling else None,
                "tokens": total.tokens, "rounds": total.rounds, "runs": len(self.runs),
                **({"members": self.members} if self.members else {})}


# --- one process: plain transformers ------------------------------------------------------------------------

class ForwardTimer:
    """Times every forward call of a module (hooks), so compute per round is measured, not assumed; on a GPU the
    device's queue is drained at both ends, so the time is the kernels' and not their launch."""

    def __init__(self, model, device: str = "cpu"):
        from peers import device as dev

        self.calls, self.ms, self._t0 = 0, 0.0, 0.0
        self.finish = (lambda: dev.finish(device)) if device.startswith("cuda") else (lambda: None)
        self.handles = [model.register_forward_pre_hook(self._pre), model.register_forward_hook(self._post)]

    def _pre(self, *a):
        self.finish()
        self._t0 = time.perf_counter()

    def _post(self, *a):
        self.finish()
        self.calls += 1
        self.ms += (time.perf_counter() - self._t0) * 1e3

    def close(self):
        for h in self.handles:
            h.remove()


@contextmanager
def count_candidates(record: list):
    """Record (drafted, accepted) of each round of transformers' assisted generation."""
    from unittest import mock

    from transformers.generation import candidate_generator as cg

    patches = []
    for cls in (cg.AssistedCandidateGenerator, cg.PromptLookupCandidateGenerator):
        get, update = cls.get_candidates, cls.update_candidate_strategy

        def get_candidates(self, input_ids, *a, _get=get, **kw):
            out = _get(self, input_ids, *a, **kw)
            self._bench_drafted = out[0].shape[1] - input_ids.shape[1]
            return out

        def update_candidate_strategy(self, input_ids, scores, num_matches, _update=update):
            record.append((getattr(self, "_bench_drafted", 0), int(num_matches)))
            return _update(self, input_ids, scores, num_matches)

        patches += [mock.patch.object(cls, "get_candidates", get_candidates),
                    mock.patch.object(cls, "update_candidate_strategy", update_candidate_strategy)]
    for p in patches:
        p.start()
    try:
        yield record
    finally:
        for p in patches:
            p.stop()


def transformers_rows(args, model_dir, tokenizer, prompts: list[str], modes: list[str], advance) -> list[Row]:
    import torch
    from transformers import AutoModelForCausalLM

    from peers.chat import render
    from peers import models
    from peers import device as dev
    from peers.memory import default_device, pick_dtype
    from peers.tensors import DTYPES

    # the baseline runs where the ring runs, in its dtype: the same device makes the ratio mean something
    device = args.device or default_device()
    dt = DTYPES[pick_dtype(args.dtype, str(device))]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dt).to(device).eval()
    assistant, extra = None, {}
    if "transformers-assisted" in modes:
        from peers.drafting import is_distilled

        if args.draft == "none":
            modes = [m for m in modes if m != "transformers-assisted"]
        elif args.draft in (None, "", "auto", "ngram") or is_distilled(models.resolve(args.draft)):
            # transformers cannot run a draft that reads the target's features: it gets prompt lookup instead
            extra = {"prompt_lookup_num_tokens": 10}
        else:
            assistant = AutoModelForCausalLM.from_pretrained(models.resolve(args.draft), dtype=dt).to(device).eval()
            extra = {"assistant_model": assistant}
    inputs = [torch.tensor([render(tokenizer, [{"role": "user", "content": p}])], device=device) for p in prompts]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def one(ids, kw, max_new, sample: Sample | None) -> None:
        timers = [ForwardTimer(m, device) for m in (model, assistant) if m is not None and (m is model or kw)]
        record: list = []
        try:
            with count_candidates(record), torch.inference_mode():
                dev.finish(device)
                t0 = time.perf_counter()
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False,
                                     pad_token_id=pad, **kw)
                dev.finish(device)
                seconds = time.perf_counter() - t0
        finally:
            for t in timers:
                t.close()
        if sample is not None:
            rounds = len(record) if record else timers[0].calls
            sample.add(Sample(tokens=out.shape[1] - ids.shape[1], seconds=seconds, rounds=rounds,
                              drafted=sum(d for d, _ in record), accepted=sum(a for _, a in record),
                              compute_ms=sum(t.ms for t in timers)))

    rows = []
    for mode in [m for m in modes if m.startswith("transformers")]:
        kw = extra if mode == "transformers-assisted" else {}
        advance(f"{mode}: warm-up")
        one(inputs[0], kw, 8, None)
        row = Row(mode, 0.0)
        for r in range(args.runs):
            sample = Sample()
            for i, ids in enumerate(inputs):
                one(ids, kw, args.max_new_tokens, sample)
                advance(f"{mode}: run {r + 1}/{args.runs}, prompt {i + 1}", 1)
            row.runs.append(sample)
        rows.append(row)
    return rows


# --- the ring -----------------------------------------------------------------------------------------------

@asynccontextmanager
async def shaped_relay(delay_ms: float):
    """An `sfchat relay` process adding delay_ms one way on every link; yields its HOST:PORT (None if no delay)."""
    if delay_ms <= 0:
        yield None
        return
    from .local import child_env, stop

    proc = subprocess.Popen([sys.executable, "-P", "-m", "sfchat", "relay", "--listen", "127.0.0.1:0", "--delay-ms",
                             f"{delay_ms:.4f}"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, text=True, env=child_env())
    try:
        with trio.fail_after(60):
            line = await trio.to_thread.run_sync(proc.stdout.readline, abandon_on_cancel=True)
        if not line.startswith("relay listening on "):
            raise RuntimeError(f"the relay did not start: {line!r}")
        yield line.split()[3]
    finally:
        stop([proc])


async def ring_rows(args, rtt_ms: float, prompts: list[str], modes: list[str], advance) -> list[Row]:
    from peers.adaptive import KPolicy
    from peers.chat import Chat
    from peers.drafting import Drafter
    from peers.sampling import SamplingParams

    from peers.options import HostOptions

    from .options import RingOptions
    from .runtime import new_drafter, open_ring

    links = args.local_peers + 1  # host -> member 1 -> … -> member N -> host
    rows = []
    async with shaped_relay(rtt_ms / links) as relay:
        opts = RingOptions(HostOptions(model=args.model, dtype=args.dtype, quant=args.quant, device=args.device,
                                       relay=relay), local_peers=args.local_peers)
        advance(f"ring at {rtt_ms:g} ms: starting {args.local_peers} peer(s)")
        async with open_ring(opts, announce=False) as ring:
            if len(ring.host.ring) != args.local_peers:
                print(f"warning: {len(ring.host.ring)} of {args.local_peers} peers hold layers; the emulated RTT "
                      f"is split over {links} links", file=sys.stderr)
            for mode in [m for m in modes if m.startswith("ring")]:
                drafter = await new_drafter(args.draft, ring) if mode == "ring-spec" else Drafter()
                policy = KPolicy(pinned=args.k)

                async def one(prompt: str, max_new: int, sample: Sample | None) -> None:
                    chat = Chat(ring.host, ring.tokenizer, ring.eos)
                    t0 = time.perf_counter()
                    _, result = await chat.reply(prompt, drafter=drafter, params=SamplingParams(), policy=policy,
                                                 max_new_tokens=max_new)
                    seconds = time.perf_counter() - t0
                    await ring.host.drop(chat.rs)
                    if sample is not None:
                        rs = result.rounds
                        sample.add(Sample(
                            tokens=len(result.token_ids), seconds=seconds, rounds=len(rs),
                            drafted=sum(r["drafted"] for r in rs), accepted=sum(r["accepted"] for r in rs),
                            compute_ms=sum(r["host_ms"] + sum(ms for _, ms in r["peers"]) + r["draft_ms"]
                                           + r["verify_ms"] for r in rs),
                            network_ms=sum(r["network_ms"] for r in rs)))

                advance(f"{mode} at {rtt_ms:g} ms: warm-up")
                await one(prompts[0], 8, None)
                row = Row(mode, rtt_ms)
                for r in range(args.runs):
                    sample = Sample()
                    for i, prompt in enumerate(prompts):
                        await one(prompt, args.max_new_tokens, sample)
                        advance(f"{mode} at {rtt_ms:g} ms: run {r + 1}/{args.runs}, prompt {i + 1}", 1)
                    row.runs.append(sample)
                row.members = [{k: m[k] for k in ("name", "layers", "device", "memory_bytes", "peak_memory_bytes")}
                               for m in ring.host.members_info() if m["state"] != "lost"]
                rows.append(row)
                drafter.close()  # a compiled draft's graphs would otherwise stay, counted in the next rows' memory
    return rows


# --- the command ----------------------------------------------------------------------------------------------

def machine_info() -> dict:
    import torch
    import transformers

    cpu = platform.processor() or "?"
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
            if hasattr(os, "sysconf") else None,
            "platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__}


def checks(rows: list[dict]) -> list[str]:
    """The ratios that matter, as measured: ring-spec over ring at each RTT, ring over transformers at 0 ms."""
    at = {(r["mode"], r["rtt_ms"]): r for r in rows}
    out = []
    for (mode, rtt), r in sorted(at.items(), key=lambda kv: kv[0][1]):
        if mode == "ring-spec" and ("ring", rtt) in at and rtt > 0:
            base = at[("ring", rtt)]["tokens_per_second"]
            out.append(f"at {rtt:g} ms: ring-spec is {r['tokens_per_second'] / base:.2f}x ring, "
                       f"{r['fraction_of_ceiling']:.0%} of its ceiling")
        if mode == "ring" and rtt == 0 and ("transformers", 0.0) in at:
            out.append(f"at 0 ms: ring is {r['tokens_per_second'] / at[('transformers', 0.0)]['tokens_per_second']:.2f}x "
                       "transformers")
    return out


CEILING_NOTE = ("ceiling: tok/round / (RTT + compute ms/round), what the mode would reach if the network cost "
                "only its round-trip time")


def print_tables(rows: list[dict], rtts: list[float], console) -> None:
    """Transformers once (one process, no network: no RTT applies), then the ring's rows for each RTT."""
    from rich.table import Table

    local = [r for r in rows if r["mode"].startswith("transformers")]
    groups = ([("transformers: one process, no network", local)] if local else []) + \
        [(f"ring at RTT {rtt:g} ms", [r for r in rows if r["rtt_ms"] == rtt and r not in local]) for rtt in rtts]
    for title, group in groups:
        if not group:
            continue
        t = Table(title=title, caption=CEILING_NOTE, caption_justify="left")
        for col in ("mode", "tok/s", "tok/round", "accept", "compute ms/round", "ceiling tok/s", "of ceiling"):
            t.add_column(col, justify="left" if col == "mode" else "right")
        for r in group:
            t.add_row(r["mode"],
                      f"{r['tokens_per_second']:.2f}", f"{r['tokens_per_round']:.2f}",
                      "-" if r["acceptance"] is None else f"{r['acceptance']:.0%}",
                      f"{r['compute_ms_per_round']:.1f}",
                      "-" if r["ceiling_tokens_per_second"] is None else f"{r['ceiling_tokens_per_second']:.2f}",
                      "-" if r["fraction_of_ceiling"] is None else f"{r['fraction_of_ceiling']:.0%}")
        console.print(t)


def draft_label(spec: str | None, model_dir) -> str:
    """What ring-spec drafts with: a default resolves to the shipped draft (embedded default target) or ngram."""
    from peers.drafting import shipped_draft

    if spec in (None, "", "auto"):
        return "shipped draft" if shipped_draft(model_dir) is not None else "ngram"
    return spec


async def bench(args) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from peers import models
    from peers.chat import load_tokenizer

    from . import bench_serve

    rtts = [float(x) for x in args.rtt_ms.split(",") if x.strip()]
    clients = [int(x) for x in args.clients.split(",") if x.strip()] if args.clients else []
    if any(n < 1 for n in clients):
        raise ValueError("--clients takes counts of 1 or more")
    modes = [m.strip() for m in (args.modes or ("" if clients else ",".join(MODES))).split(",") if m.strip()]
    if bad := [m for m in modes if m not in MODES]:
        raise ValueError(f"unknown mode(s) {', '.join(bad)}; choose from {', '.join(MODES)}")
    if args.draft == "none":
        modes = [m for m in modes if m not in ("transformers-assisted", "ring-spec")]
    prompts = DEFAULT_PROMPTS
    if args.prompts:
        with open(args.prompts) as f:
            prompts = [ln.strip() for ln in f if ln.strip()]
    if not prompts or args.runs < 1 or any(r < 0 for r in rtts):
        raise ValueError("need at least one prompt, --runs >= 1 and RTTs >= 0")
    model_dir = models.resolve(args.model, say=lambda *a: print(*a, file=sys.stderr))
    tokenizer = load_tokenizer(model_dir)
    n_tf = sum(m.startswith("transformers") for m in modes)
    n_ring = sum(m.startswith("ring") for m in modes)
    total = args.runs * len(prompts) * (n_tf + n_ring * len(rtts)) + args.runs * len(clients) * len(rtts)
    err = Console(stderr=True)
    logging.getLogger("sfchat.host").setLevel(logging.ERROR)  # closing each ring "loses" its members: not news
    rows: list[Row] = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as progress:
        task = progress.add_task("loading", total=total)

        def advance(text: str, n: int = 0) -> None:
            progress.update(task, description=text, advance=n)

        if n_tf:
            rows += await trio.to_thread.run_sync(transformers_rows, args, model_dir, tokenizer, prompts, modes, advance)
        if n_ring:
            for rtt in rtts:
                rows += await ring_rows(args, rtt, prompts, modes, advance)
        serving = []
        for rtt in rtts if clients else []:
            serving += await bench_serve.serving_rows(args, rtt, clients, prompts, advance)
    out = [r.to_dict() for r in rows]
    console = Console(width=None if sys.stdout.isatty() else 110)
    if out:
        print_tables(out, rtts, console)
    if serving:
        bench_serve.print_table(serving, console)
    notes = checks(out) + bench_serve.checks(serving)
    for line in notes:
        print(line)
    if args.json:
        doc = {"machine": machine_info(), "command": "sfchat " + " ".join(sys.argv[1:]) if sys.argv else "",
               "config": {"model": args.model or models.DEFAULT_MODEL, "draft": draft_label(args.draft, model_dir),
                          "dtype": args.dtype, "local_peers": args.local_peers, "rtt_ms": rtts, "runs": args.runs,
                          "max_new_tokens": args.max_new_tokens, "prompts": prompts},
               "rows": out, "serving_rows": serving, "checks": notes}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 0
