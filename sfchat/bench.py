"""`sfchat bench`: tokens/s of plain transformers and of the ring, over links shaped to a given round-trip time.

Modes: `transformers` (plain generate, one process: the compute ceiling), `transformers-assisted` (its own
assisted generation with the same draft), `ring` (no speculation) and `ring-spec`, once for each `--in-flight`
value (by default with rounds in flight and with one at a time: their ratio is printed). Each RTT above 0 puts a
shaping relay under the ring, its one-way delay being RTT / (ring links), so one pass around the ring (host ->
member 1 -> … -> host) adds exactly that RTT. One ring per RTT serves every prompt and run, warmed up first.

What each column means is LEGEND, printed under the tables and in `sfchat bench --help`.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import trio

from .local import local_name
from .shaped_relay import shaped_relay
from .tree_args import in_flight_rows_arg, tree_args

DEFAULT_PROMPTS = [
    "Explain quantum entanglement in simple terms.",
    "Write a Python function that computes Fibonacci numbers using dynamic programming.",
    "What are the advantages of pipeline parallelism?",
]
MODES = ["transformers", "transformers-assisted", "ring", "ring-spec"]
LEGEND = """\
columns:
  tok/s             new tokens / wall time of each answer, the prompt's reading (prefill) and the first token
                    included; the median over --runs runs of every prompt
  tokens/round      tokens an answer gained per round: one forward of the model (transformers) or one trip
                    around the ring that checks the drafts (not counting rounds a verdict cancelled); above
                    1, drafts were accepted
  accept            the share of drafted tokens the model accepted (accepted / drafted; - : nothing drafted)
  compute ms/round  measured compute per round: every member's forward, drafting that was not hidden behind
                    the previous round, and checking the drafts; the network's time is not in it
  ceiling tok/s     tokens/round / (RTT + compute ms/round): what the mode would reach if the network cost
                    only its round trip and nothing but compute ran in between
  of ceiling        tok/s / ceiling tok/s: the rest went to the prompt's reading, waiting and the event loop
a ring-spec row names its --in-flight: "rounds in flight (auto)" (the policy chose how many of a conversation's
rounds are on the ring at once) or "N in flight" (pinned; 1: each round waits for the one before it)
under each ring's table, for each ring-spec row:
  in flight         the conversation's rounds on the ring when each was sent, itself included, on average;
                    1.00: each round waited for the one before it
  cancelled         the share of rounds whose every draft a verdict contradicted before they came back
  hedges caught     rejections that a round already in flight had hedged (it drafted the model's token there),
                    so no round trip was lost; over all of the row's runs
  ms per pass       each member's mean milliseconds per pass at T=1 (one token) and T=K+1 (K drafts)
the header names the machine (CPU, cores, GPU, torch), so figures compare with others' (docs/benchmarks.md),
and with --pin the cores of the host and of each local member"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft", help="default: the shipped draft for the embedded default, a hub model's sibling, else "
                   "ngram; or ngram, none, a draft model or a distilled draft (smollm2-135m drafting itself is an "
                   "upper bound); simulated:A (A in 0..1): the target's own greedy continuation with each token kept "
                   "with probability A, for speculation of a known acceptance; simulated:A,B: where the first guess "
                   "is wrong the second is right with probability B (trees); simulated:A/A2…: a row for each")
    p.add_argument("--k", type=int, help="pin the draft length (default: adaptive)")
    tree_args(p)
    in_flight_rows_arg(p)
    p.add_argument("--local-peers", type=int, default=1, metavar="N",
                   help="peer processes in the ring (default: 1, where host, ask and serve start none: the emulated "
                   "round trip is laid on the links between members, and the host alone has none)")
    p.add_argument("--pin", action="store_true", help="put the host and each local member on cores of their own "
                   "(the cores split in blocks, torch's threads to match): a machine per member on one box")
    p.add_argument("--rtt-ms", default="0,20,86,175", help="comma-separated ring round-trip times to emulate")
    p.add_argument("--placement", choices=["speed", "memory"], default="memory",
                   help="how the ring's layers are split (default: memory, so that every local peer holds layers "
                   "and the emulated round trip is crossed; speed: by each one's measured ms per layer)")
    for flag, what in (("threads", "torch threads"), ("dtype", "dtype"), ("quant", "quantization"),
                       ("offer-gb", "offered GB")):
        p.add_argument(f"--member-{flag}", type=member_list, metavar="A,B,…", default=[],
                       help=f"each local peer's own {what}, in order (an empty item: the common one), to make "
                       "members of different speeds on one box")
    p.add_argument("--prompts", help="a file with one prompt per line (default: three built-in prompts)")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N",
                   help="the longest answer to each prompt, in tokens")
    p.add_argument("--runs", type=int, default=3, help="timed runs of every prompt per mode; tokens/s is their median")
    p.add_argument("--modes", help="a subset of " + ",".join(MODES) + " (default: all, or none with --clients)")
    p.add_argument("--clients", metavar="N,N…", help="also serve the endpoint and measure this many concurrent "
                   "clients over HTTP (aggregate and per-client tokens/s, time to first token); e.g. 1,2,4,8")
    p.add_argument("--json", metavar="OUT", help="also write the results to this JSON file (row by row, as they end)")


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
    in_flight: int = 0  # summed over rounds: the conversation's rounds on the ring when each was sent
    cancelled: int = 0  # rounds whose every draft was dead before they came back
    caught: int = 0  # rejections a round in flight had hedged

    def add(self, other: "Sample") -> None:
        for k in self.__dataclass_fields__:
            setattr(self, k, getattr(self, k) + getattr(other, k))


@dataclass
class Row:
    mode: str
    rtt_ms: float
    runs: list[Sample] = field(default_factory=list)
    members: list[dict] = field(default_factory=list)  # a ring's members and their memory after the runs
    draft: str | None = None  # what drafted (ring-spec, transformers-assisted)
    error: str | None = None  # why the mode failed: the row says so, the others still print
    passes: dict = field(default_factory=dict)  # member -> positions a pass carried (T) -> [ms of each pass]
    round_ms: list = field(default_factory=list)  # each measured round's milliseconds, draft to commit
    in_flight: int | str | None = None  # ring-spec: its --in-flight, "auto" or N

    def to_dict(self) -> dict:
        head = {"mode": self.mode, "rtt_ms": self.rtt_ms, **({"draft": self.draft} if self.draft else {}),
                **({"in_flight": self.in_flight} if self.in_flight is not None else {})}
        if self.error or not self.runs:
            return head | {"error": self.error or "no runs"}
        total = Sample()
        for s in self.runs:
            total.add(s)
        tps = statistics.median(s.tokens / s.seconds for s in self.runs if s.seconds)
        useful = total.rounds - total.cancelled  # (a round a verdict cancelled commits nothing, by design)
        tpr = total.tokens / useful if useful else 0.0
        compute = total.compute_ms / total.rounds if total.rounds else 0.0
        rtt = self.rtt_ms if self.mode.startswith("ring") else 0.0  # one process: no network in its rounds
        ceiling = tpr / ((rtt + compute) / 1e3) if rtt + compute > 0 else None
        return head | {
            "tokens_per_second": round(tps, 3),
            "tokens_per_second_runs": [round(s.tokens / s.seconds, 3) for s in self.runs],
            "tokens_per_round": round(tpr, 3),
            "acceptance": round(total.accepted / total.drafted, 4) if total.drafted else None,
            "compute_ms_per_round": round(compute, 3),
            "network_ms_per_round": round(total.network_ms / total.rounds, 3) if total.rounds else None,
            "ceiling_tokens_per_second": round(ceiling, 3) if ceiling else None,
            "fraction_of_ceiling": round(tps / ceiling, 4) if ceiling else None,
            **({"rounds_in_flight": round(total.in_flight / total.rounds, 3),
                "cancelled_share": round(total.cancelled / total.rounds, 4),
                "hedges_caught": total.caught} if self.mode.startswith("ring") and total.rounds else {}),
            "tokens": total.tokens, "rounds": total.rounds, "runs": len(self.runs),
            **({"members": self.members} if self.members else {}),
            **({"pass_ms": pass_ms(self.passes)} if self.passes else {}),
            **({"round_ms_all": [round(ms, 2) for ms in self.round_ms]} if self.round_ms else {})}


def pass_ms(passes: dict) -> dict:
    """Each member's mean milliseconds per pass at T = 1 (one token) and at the most frequent T = K+1 (K drafts)."""
    out = {}
    for member, by_t in passes.items():
        d = {"T=1": round(statistics.mean(by_t[1]), 3)} if 1 in by_t else {}
        if wide := [t for t in by_t if t > 1]:
            t = max(wide, key=lambda t: len(by_t[t]))
            d[f"T={t}"] = round(statistics.mean(by_t[t]), 3)
        out[member] = d
    return out


def one_line(e: BaseException) -> str:
    """An exception as one line for a row (a group: its first leaf, as trio's nurseries wrap them)."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:300]


# --- one process: plain transformers ------------------------------------------------------------------------

class ForwardTimer:
    """Times every forward call of a module (hooks), so compute per round is measured, not assumed; on a GPU the
    device's queue is drained at both ends, so the time is the kernels' and not their launch."""

    def __init__(self, model, device: str = "cpu"):
        from peers.compute import device as dev

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


@dataclass
class Baseline:
    """Plain transformers where the ring runs, in its dtype (the same device makes the ratio mean something), and
    what its assisted generation drafts with (loaded for that mode alone: a draft that fails fails its row)."""

    model: object
    device: str
    dtype: object
    pad: int
    assistant: object = None


def load_baseline(args, model_dir, tokenizer) -> Baseline:
    import torch
    from transformers import AutoModelForCausalLM

    from peers import DTYPES, default_device, pick_dtype
    from peers.compute import cpu_quant
    from peers.models.gguf_grid import stored_grid
    from peers.models.source import DEFAULT_MODEL

    device = args.device or default_device()
    dt = DTYPES[pick_dtype(args.dtype, str(device))]
    quant = cpu_quant.pick_quant(args.quant, str(device), Path(model_dir).name == DEFAULT_MODEL)
    if quant in cpu_quant.KINDS and not str(device).startswith("cuda"):  # the ring's kernels, on one process:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)  # quantized from float32
        cpu_quant.quantize_model(model, quant, stored_grid(model_dir))                # as a shard's are
        model = model.to(dt).eval()
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dt).to(device).eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return Baseline(model, str(device), dt, pad)


def assisted(args, base: Baseline) -> tuple[dict, str]:
    """generate()'s arguments for transformers-assisted, and what drafts."""
    from transformers import AutoModelForCausalLM

    from peers import models
    from peers import is_distilled

    if args.draft in (None, "", "auto", "ngram") or is_distilled(models.resolve(args.draft)):
        # transformers cannot run a draft that reads the target's features: it gets prompt lookup instead
        return {"prompt_lookup_num_tokens": 10}, "prompt lookup"
    base.assistant = AutoModelForCausalLM.from_pretrained(models.resolve(args.draft), dtype=base.dtype)
    base.assistant = base.assistant.to(base.device).eval()
    return {"assistant_model": base.assistant}, args.draft


def timed_generate(base: Baseline, ids, kw: dict, max_new: int) -> Sample:
    """One greedy generate, timed end to end, its rounds and compute counted."""
    import torch

    from peers.compute import device as dev

    timers = [ForwardTimer(m, base.device) for m in (base.model, base.assistant)
              if m is not None and (m is base.model or kw)]
    record: list = []
    try:
        with count_candidates(record), torch.inference_mode():
            dev.finish(base.device)
            t0 = time.perf_counter()
            out = base.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                                      do_sample=False, pad_token_id=base.pad, **kw)
            dev.finish(base.device)
            seconds = time.perf_counter() - t0
    finally:
        for t in timers:
            t.close()
    return Sample(tokens=out.shape[1] - ids.shape[1], seconds=seconds, rounds=len(record) or timers[0].calls,
                  drafted=sum(d for d, _ in record), accepted=sum(a for _, a in record),
                  compute_ms=sum(t.ms for t in timers))


def transformers_rows(args, model_dir, tokenizer, prompts: list[str], modes: list[str], advance, done) -> None:
    """The transformers modes' rows, each handed to `done` as it ends (a failed one with its error)."""
    import torch

    from peers import render

    modes = [m for m in modes if m.startswith("transformers")]
    try:
        base = load_baseline(args, model_dir, tokenizer)
    except Exception as e:  # noqa: BLE001 - the ring's rows are still measured
        for mode in modes:
            done(Row(mode, 0.0, error=one_line(e)))
        return
    inputs = [torch.tensor([render(tokenizer, [{"role": "user", "content": p}])], device=base.device)
              for p in prompts]
    for mode in modes:
        row = Row(mode, 0.0)
        try:
            kw = {}
            if mode == "transformers-assisted":
                kw, row.draft = assisted(args, base)
            advance(f"{mode}: warm-up")
            timed_generate(base, inputs[0], kw, 8)
            for r in range(args.runs):
                sample = Sample()
                for i, ids in enumerate(inputs):
                    sample.add(timed_generate(base, ids, kw, args.max_new_tokens))
                    advance(f"{mode}: run {r + 1}/{args.runs}, prompt {i + 1}", 1)
                row.runs.append(sample)
        except Exception as e:  # noqa: BLE001 - one mode's failure must not lose the others' figures
            row.error = one_line(e)
        done(row)


# --- the ring -----------------------------------------------------------------------------------------------

async def ring_rows(args, rtt_ms: float, prompts: list[str], modes: list[str], advance, done,
                    cores: dict | None = None) -> None:
    """The ring's rows at one RTT, each handed to `done` as it ends; a ring that does not come up fails them all.
    `cores` (--pin): each process's cores, the host's and each local member's by name."""
    from peers import HostOptions

    from .options import RingOptions
    from .runtime import open_ring

    todo = ring_modes(args.draft, modes, args.in_flight)
    links = args.local_peers + 1  # host -> member 1 -> … -> member N -> host
    try:
        async with shaped_relay(rtt_ms / links) as relay:
            opts = RingOptions(HostOptions(model=args.model, dtype=args.dtype, quant=args.quant, device=args.device,
                                           relay=relay, graphs=not args.no_graphs, offer_gb=args.offer_gb,
                                           placement=args.placement),
                               local_peers=args.local_peers, local_cores=member_cores(cores),
                               local_args=member_args(args))
            advance(f"ring at {rtt_ms:g} ms: starting {args.local_peers} peer(s)")
            async with open_ring(opts, announce=False) as ring:
                if len(ring.host.ring) != args.local_peers:
                    print(f"warning: {len(ring.host.ring)} of {args.local_peers} peers hold layers; the emulated "
                          f"RTT is split over {links} links", file=sys.stderr)
                while todo:
                    done(await ring_row(args, ring, *todo[0], rtt_ms, prompts, advance, cores))
                    todo.pop(0)
    except Exception as e:  # noqa: BLE001 - the ring did not come up (or went down): its rows say why
        for mode, _, flight in todo:
            done(Row(mode, rtt_ms, error=one_line(e), in_flight=flight))


def member_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",")]


def member_args(args) -> tuple[list[str], ...]:
    """Each local peer's own join flags from --member-threads, --member-dtype, --member-quant, --member-offer-gb."""
    own = [[] for _ in range(args.local_peers)]
    for flag in ("threads", "dtype", "quant", "offer-gb"):
        for i, v in enumerate(getattr(args, "member_" + flag.replace("-", "_"))[: args.local_peers]):
            if v:
                own[i] += [f"--{flag}", v]
    return tuple(own)


def ring_modes(draft: str | None, modes: list[str], in_flight: list[int | None]) -> list[tuple]:
    """(mode, what drafts, its --in-flight) for each ring row: ring-spec once per simulated acceptance and, for
    each, once per --in-flight value ("auto" or N); ring (nothing drafted, so nothing to send ahead) once."""
    from peers import parse_simulated

    out = []
    for mode in [m for m in modes if m.startswith("ring")]:
        if mode != "ring-spec":
            out.append((mode, "none", None))
            continue
        acceptances = parse_simulated(draft)
        specs = [f"simulated:{a:g},{b:g}" for a, b in acceptances] if acceptances else [draft]
        out += [(mode, spec, "auto" if n is None else n) for spec in specs for n in in_flight]
    return out


def member_cores(cores: dict | None) -> tuple[list[int], ...]:
    """The cores of each local member, in the order they start (the host's are the first entry)."""
    return tuple(list(cores.values())[1:]) if cores else ()


_references: dict[tuple, list[int]] = {}  # (model, prompt, max new tokens) -> the ring's greedy tokens


async def ring_drafter(args, ring, spec: str | None, prompts: list[str]):
    """What a row drafts with: nothing, --draft, or a simulated draft over the plain greedy answers (one plain
    run per prompt, whatever the RTT: the answer is the same on every ring)."""
    from peers import Drafter
    from peers import SimulatedDrafter, parse_simulated
    from peers import SamplingParams

    from .runtime import new_drafter

    if spec == "none":
        return Drafter()
    if (acceptance := parse_simulated(spec)) is None:
        return await new_drafter(spec, ring)
    for prompt in prompts:  # the target's own greedy continuation, from a plain run of the same prompt
        if (key := (args.model, prompt, args.max_new_tokens)) not in _references:
            _references[key], _ = await ring_reply(ring, prompt, Drafter(), policy_for(args), args.max_new_tokens,
                                                   SamplingParams())
    return SimulatedDrafter(acceptance[0][0], ring.host.config.vocab_size,
                            [_references[(args.model, p, args.max_new_tokens)] for p in prompts],
                            second=acceptance[0][1])


def policy_for(args, in_flight: int | str | None = None):
    """The row's draft policy: --k, --tree-nodes, --no-trees, and its --in-flight (None or "auto": the policy's)."""
    from peers import KPolicy

    return KPolicy(pinned=args.k, tree_nodes=args.tree_nodes, trees=not args.no_trees,
                   in_flight=None if in_flight in (None, "auto") else in_flight)


async def ring_reply(ring, prompt: str, drafter, policy, max_new: int, params):
    """One answer on a conversation of its own, whose caches are dropped after: its tokens (prompt and answer) and
    its result."""
    from peers import Chat

    chat = Chat(ring.host, ring.tokenizer, ring.eos)
    _, result = await chat.reply(prompt, drafter=drafter, params=params, policy=policy, max_new_tokens=max_new)
    await ring.host.drop(chat.rs)
    return chat.tokens, result


async def ring_row(args, ring, mode: str, spec: str | None, flight: int | str | None, rtt_ms: float,
                   prompts: list[str], advance, cores: dict | None = None) -> Row:
    """One ring row: warmed up, then --runs runs of every prompt; a failure is the row's error."""
    from peers import SamplingParams

    row, drafter = Row(mode, rtt_ms, in_flight=flight), None
    label = mode_cell(row.to_dict(), " ")
    try:
        drafter = await ring_drafter(args, ring, spec, prompts)
        row.draft = drafter.name if mode == "ring-spec" else None
        policy = policy_for(args, flight)

        async def one(prompt: str, max_new: int, sample: Sample | None) -> None:
            t0 = time.perf_counter()
            _, result = await ring_reply(ring, prompt, drafter, policy, max_new, SamplingParams())
            seconds = time.perf_counter() - t0
            if sample is not None:
                sample.add(ring_sample(result.rounds, len(result.token_ids), seconds))
                count_passes(row.passes, result.rounds)
                row.round_ms += [r["round_ms"] for r in result.rounds if "round_ms" in r]

        advance(f"{label} at {rtt_ms:g} ms: warm-up")
        await one(prompts[0], 8, None)
        for r in range(args.runs):
            sample = Sample()
            for i, prompt in enumerate(prompts):
                await one(prompt, args.max_new_tokens, sample)
                advance(f"{label} at {rtt_ms:g} ms: run {r + 1}/{args.runs}, prompt {i + 1}", 1)
            row.runs.append(sample)
        row.members = [{k: m.get(k) for k in ("name", "layers", "device", "memory_bytes", "peak_memory_bytes",
                                              "span_memory_bytes", "graphs", "planned_bytes", "ms_per_layer",
                                              "share", "spare")}
                       for m in ring.host.members_info() if m["state"] not in ("lost", "left")]
        if cores is not None:  # what the system says each process may run on (not what was asked)
            pids = {"host": 0} | {local_name(i): p.pid for i, p in enumerate(ring.local.procs if ring.local else [])}
            for m in row.members:
                with suppress(ProcessLookupError):  # (a member that has just gone)
                    if m["name"] in pids:
                        m["cores"] = sorted(os.sched_getaffinity(pids[m["name"]]))
    except Exception as e:  # noqa: BLE001 - one mode's failure must not lose the others' figures
        row.error = one_line(e)
    finally:
        if drafter is not None:
            # a compiled draft's graphs would otherwise stay, counted in the next rows' memory
            await trio.to_thread.run_sync(drafter.close)
    return row


def ring_sample(rounds: list[dict], tokens: int, seconds: float) -> Sample:
    return Sample(tokens=tokens, seconds=seconds, rounds=len(rounds), drafted=sum(r["drafted"] for r in rounds),
                  accepted=sum(r["accepted"] for r in rounds),
                  compute_ms=sum(r["host_ms"] + sum(ms for _, ms in r["peers"]) + r["draft_ms"] + r["verify_ms"]
                                 for r in rounds),
                  network_ms=sum(r["network_ms"] for r in rounds), in_flight=sum(r["in_flight"] for r in rounds),
                  cancelled=sum(r["cancelled"] for r in rounds), caught=sum(r["caught"] for r in rounds))


def count_passes(passes: dict, rounds: list[dict]) -> None:
    """Each member's milliseconds per pass, by the positions the pass carried (T: the drafts and one more)."""
    for r in rounds:
        t = r["drafted"] + 1
        for member, ms in [("host", r["host_ms"])] + [tuple(p) for p in r["peers"]]:
            passes.setdefault(member, {}).setdefault(t, []).append(ms)


# --- the command ----------------------------------------------------------------------------------------------

def machine_info() -> dict:
    import torch
    import transformers

    cpu = platform.processor() or "?"
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
    from peers import pick_dtype

    return {"cpu": cpu, "cores": os.cpu_count(), "gpus": gpus, "torch_threads": torch.get_num_threads(),
            "cpu_dtype": pick_dtype("auto", "cpu"),  # bfloat16 where the CPU multiplies it natively
            "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
            if hasattr(os, "sysconf") else None,
            "platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__}


def checks(rows: list[dict]) -> list[str]:
    """The ratios that matter, as measured: ring-spec over ring at each RTT, ring-spec with rounds in flight over
    the same with one in flight (same RTT, same draft), ring over transformers at 0 ms."""
    ok = [r for r in rows if "error" not in r]
    ring = {r["rtt_ms"]: r for r in ok if r["mode"] == "ring"}
    one = {(r["rtt_ms"], r.get("draft")): r for r in ok if r["mode"] == "ring-spec" and r.get("in_flight") == 1}
    plain = next((r for r in ok if r["mode"] == "transformers"), None)
    out = []
    for r in sorted(ok, key=lambda r: r["rtt_ms"]):
        if r["mode"] == "ring-spec" and r["rtt_ms"] in ring and r["rtt_ms"] > 0:
            out.append(f"at {r['rtt_ms']:g} ms: {mode_cell(r, ' ')} is "
                       f"{r['tokens_per_second'] / ring[r['rtt_ms']]['tokens_per_second']:.2f}x ring, "
                       f"{r['fraction_of_ceiling']:.0%} of its ceiling")
        if r["mode"] == "ring-spec" and r.get("in_flight") != 1 and (base := one.get((r["rtt_ms"], r.get("draft")))):
            out.append(f"at {r['rtt_ms']:g} ms: ring-spec ({r['draft']}) with {flight_label(r['in_flight'])} is "
                       f"{r['tokens_per_second'] / base['tokens_per_second']:.2f}x the same with 1 in flight "
                       f"({r['tokens_per_second']:.2f} against {base['tokens_per_second']:.2f} tok/s)")
        if r["mode"] == "ring" and r["rtt_ms"] == 0 and plain is not None:
            out.append(f"at 0 ms: ring is {r['tokens_per_second'] / plain['tokens_per_second']:.2f}x transformers")
    return out


def pin(local_peers: int, say) -> dict | None:
    """--pin: this process (the host) on its cores now, before anything runs on torch; the cores each local member
    will pin itself to as it starts. Returns each process's cores by name (None where the system cannot pin)."""
    from .pinning import can_pin, pin_self, split

    if not can_pin():
        say("bench: --pin: this system cannot pin a process to cores (no sched_setaffinity); running unpinned")
        return None
    cores, n = sorted(os.sched_getaffinity(0)), local_peers + 1
    if n > len(cores):
        say(f"bench: --pin: {n} processes (the host, {local_peers} members) on {len(cores)} cores share them "
            "round-robin")
    blocks = split(n, cores)
    pin_self(blocks[0])
    return {"host": blocks[0]} | {local_name(i): b for i, b in enumerate(blocks[1:])}


def header(head: dict) -> list[str]:
    """The machine, and with --pin where each process runs."""
    from .pinning import cores_text

    lines = [machine_line(head["machine"])]
    if head.get("pin"):
        lines.append("pinned: " + ", ".join(f"{name} on {cores_text(c)}" for name, c in head["pin"].items())
                     + "; torch threads: as many as each one's cores")
    return lines


def machine_line(m: dict) -> str:
    """The machine in one line: what a reader needs to compare their figures with these."""
    gpu = ", ".join(m["gpus"]) if m["gpus"] else "no GPU"
    return (f"machine: {m['cpu']}, {m['cores']} cores, {gpu}; torch {m['torch']}, {m['torch_threads']} threads"
            + (f"; --dtype auto on the CPU: {m['cpu_dtype']}" if m.get("cpu_dtype") else ""))


def flight_label(n: int | str) -> str:
    """A ring-spec row's --in-flight, as its label says it."""
    return "rounds in flight (auto)" if n == "auto" else f"{n} in flight"


def mode_cell(r: dict, sep: str = "\n") -> str:
    """A row's mode (ring-spec: with its --in-flight), what drafted, and why it failed if it did."""
    text = r["mode"] + (f",{sep}{flight_label(r['in_flight'])}" if "in_flight" in r else "")
    text += f"{sep}({r['draft']})" if r.get("draft") else ""
    return f"{text}{sep}failed: {r['error']}" if "error" in r else text


def row_line(r: dict) -> str:
    """A row as one line of progress, as it ends."""
    if "error" in r:
        return f"bench: {mode_cell(r, ' ')} (at {r['rtt_ms']:g} ms)"
    return (f"bench: {mode_cell(r, ' ')} at {r['rtt_ms']:g} ms: {r['tokens_per_second']:.2f} tok/s, "
            f"{r['tokens_per_round']:.2f} tokens/round")


def short_label(r: dict) -> str:
    """A row's mode and --in-flight, without its draft (the table names it)."""
    return r["mode"] + (f", {flight_label(r['in_flight'])}" if "in_flight" in r else "")


def flight_line(r: dict) -> str:
    """A ring row's rounds in flight (mean), the share cancelled and the hedges caught."""
    return (f"{r['rounds_in_flight']:.2f} in flight, {r['cancelled_share']:.0%} cancelled, "
            f"{r['hedges_caught']} hedges caught: {short_label(r)}")


def passes_line(r: dict) -> str:
    """Each member's milliseconds per pass at T = 1 and T = K+1, as measured in a ring row."""
    return f"{short_label(r)}: " + "; ".join(
        f"{m} " + ", ".join(f"{ms:.1f} ms at {t}" for t, ms in by_t.items()) for m, by_t in r["pass_ms"].items())


def print_tables(rows: list[dict], rtts: list[float], console) -> None:
    """Transformers once (one process, no network: no RTT applies), then the ring's rows for each RTT, each with
    its members' milliseconds per pass."""
    from rich.table import Table

    local = [r for r in rows if r["mode"].startswith("transformers")]
    groups = ([("transformers: one process, no network", local)] if local else []) + \
        [(f"ring at RTT {rtt:g} ms", [r for r in rows if r["rtt_ms"] == rtt and r not in local]) for rtt in rtts]
    for title, group in groups:
        if not group:
            continue
        t = Table(title=title)
        for col in ("mode", "tok/s", "tokens/round", "accept", "compute ms/round", "ceiling tok/s", "of ceiling"):
            t.add_column(col, justify="left" if col == "mode" else "right")
        for r in group:
            if "error" in r:
                t.add_row(mode_cell(r), *["-"] * 6)
                continue
            t.add_row(mode_cell(r),
                      f"{r['tokens_per_second']:.2f}", f"{r['tokens_per_round']:.2f}",
                      "-" if r["acceptance"] is None else f"{r['acceptance']:.0%}",
                      f"{r['compute_ms_per_round']:.1f}",
                      "-" if r["ceiling_tokens_per_second"] is None else f"{r['ceiling_tokens_per_second']:.2f}",
                      "-" if r["fraction_of_ceiling"] is None else f"{r['fraction_of_ceiling']:.0%}")
        console.print(t)
        if lines := [flight_line(r) for r in group if r["mode"] == "ring-spec" and "rounds_in_flight" in r]:
            console.print("rounds in flight, cancelled, hedges caught:\n  " + "\n  ".join(lines), highlight=False)
        if lines := [passes_line(r) for r in group if r.get("pass_ms")]:
            console.print("ms per pass, by member and positions carried (T):\n  " + "\n  ".join(lines))


def draft_label(spec: str | None, model: str | None, model_dir) -> str:
    """What ring-spec drafts with: a default resolves to the shipped draft (embedded default target), a hub model's
    sibling or ngram (each row names the draft it used: a sibling that cannot be had leaves ngram)."""
    from peers import shipped_draft
    from peers import sibling_draft
    from peers import parse_simulated, simulated_name
    from peers.models import parse_hub_id as parse

    if (acceptances := parse_simulated(spec)) is not None:
        return "; ".join(simulated_name(a, b) for a, b in acceptances)
    if spec in (None, "", "auto"):
        if shipped_draft(model_dir) is not None:
            return "shipped draft"
        hub = parse(model) if model and not os.path.exists(model) else None
        return sibling_draft(hub[0] if hub else None) or "ngram"
    return spec


@dataclass
class Plan:
    """What a bench measures, checked before anything is loaded."""

    rtts: list[float]
    clients: list[int]
    modes: list[str]
    prompts: list[str]
    cores: dict | None = None  # --pin: each process's cores, by name (the host first); None: not pinned


def bench_plan(args) -> Plan:
    from peers import parse_simulated

    rtts = [float(x) for x in args.rtt_ms.split(",") if x.strip()]
    clients = [int(x) for x in args.clients.split(",") if x.strip()] if args.clients else []
    if any(n < 1 for n in clients):
        raise ValueError("--clients takes counts of 1 or more")
    modes = [m.strip() for m in (args.modes or ("" if clients else ",".join(MODES))).split(",") if m.strip()]
    if bad := [m for m in modes if m not in MODES]:
        raise ValueError(f"unknown mode(s) {', '.join(bad)}; choose from {', '.join(MODES)}")
    if args.draft == "none":
        modes = [m for m in modes if m not in ("transformers-assisted", "ring-spec")]
    if parse_simulated(args.draft) is not None:  # transformers' assisted generation cannot run one
        modes = [m for m in modes if m != "transformers-assisted"]
    prompts = DEFAULT_PROMPTS
    if args.prompts:
        with open(args.prompts) as f:
            prompts = [ln.strip() for ln in f if ln.strip()]
    if not prompts or args.runs < 1 or any(r < 0 for r in rtts):
        raise ValueError("need at least one prompt, --runs >= 1 and RTTs >= 0")
    return Plan(rtts, clients, modes, prompts)


class Results:
    """The rows as they end: each one printed to stderr as a line of progress and, with --json, written at once
    (a bench cut short keeps what it measured)."""

    def __init__(self, args, plan: Plan, draft: str, console):
        from peers import models

        self.path, self.console, self.rows, self.serving, self.checks = args.json, console, [], [], []
        self.head = {"machine": machine_info(), "command": "sfchat " + " ".join(sys.argv[1:]) if sys.argv else "",
                     "config": {"model": args.model or models.DEFAULT_MODEL, "draft": draft, "dtype": args.dtype,
                                "local_peers": args.local_peers, "rtt_ms": plan.rtts, "runs": args.runs,
                                "max_new_tokens": args.max_new_tokens, "prompts": plan.prompts,
                                "in_flight": ["auto" if n is None else n for n in args.in_flight]},
                     "pin": plan.cores}

    def done(self, row: Row) -> None:
        self.rows.append(d := row.to_dict())
        self.console.print(row_line(d), highlight=False, markup=False)
        self.write()

    def write(self) -> None:
        if self.path:
            with open(self.path, "w") as f:
                json.dump(self.head | {"rows": self.rows, "serving_rows": self.serving, "checks": self.checks}, f,
                          indent=2)


async def measure(args, plan: Plan, model_dir, tokenizer, results: Results, progress) -> None:
    """Every row: transformers, then the ring at each RTT, then served clients at each RTT."""
    from . import bench_serve

    n_tf = sum(m.startswith("transformers") for m in plan.modes)
    n_ring = len(ring_modes(args.draft, plan.modes, args.in_flight))  # ring rows at each RTT
    task = progress.add_task("loading", total=args.runs * len(plan.prompts) * (n_tf + n_ring * len(plan.rtts))
                             + args.runs * len(plan.clients) * len(plan.rtts))

    def advance(text: str, n: int = 0) -> None:
        progress.update(task, description=text, advance=n)

    if n_tf:
        await trio.to_thread.run_sync(transformers_rows, args, model_dir, tokenizer, plan.prompts, plan.modes,
                                      advance, results.done)
    for rtt in plan.rtts if n_ring else []:
        await ring_rows(args, rtt, plan.prompts, plan.modes, advance, results.done, plan.cores)
    for rtt in plan.rtts if plan.clients else []:
        try:
            results.serving += await bench_serve.serving_rows(args, rtt, plan.clients, plan.prompts, advance,
                                                              member_cores(plan.cores))
        except Exception as e:  # noqa: BLE001 - the rows measured so far are kept
            results.console.print(f"bench: serving at {rtt:g} ms: failed: {one_line(e)}", markup=False)
        results.write()


async def bench(args) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from peers import models
    from peers import load_tokenizer

    from . import bench_serve

    plan = bench_plan(args)
    err = Console(stderr=True)
    if args.pin:  # first: the host's threads (torch's, trio's) start on its cores
        plan.cores = pin(args.local_peers, lambda line: err.print(line, highlight=False, markup=False, soft_wrap=True))
    model_dir = models.resolve(args.model, say=lambda *a: print(*a, file=sys.stderr))
    tokenizer = load_tokenizer(model_dir)
    logging.getLogger("sfchat.host").setLevel(logging.ERROR)  # closing each ring "loses" its members: not news
    results = Results(args, plan, draft_label(args.draft, args.model, model_dir), err)
    for line in header(results.head):
        err.print(line, highlight=False, markup=False)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as progress:
        await measure(args, plan, model_dir, tokenizer, results, progress)
    console = Console(width=None if sys.stdout.isatty() else 110)
    for line in header(results.head):  # one line each, whatever the width: they are copied into reports
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    if results.rows:
        print_tables(results.rows, plan.rtts, console)
    if results.serving:
        bench_serve.print_table(results.serving, console)
    if results.rows or results.serving:
        console.print(LEGEND + (bench_serve.LEGEND if results.serving else ""), highlight=False, markup=False)
    results.checks = checks(results.rows) + bench_serve.checks(results.serving)
    for line in results.checks:
        print(line)
    results.write()
    return 0 if results.rows or results.serving else 1
