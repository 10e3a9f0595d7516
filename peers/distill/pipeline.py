"""`sfchat distill`: the target writes data, the draft's head rows are chosen, the draft is trained and exported.

Everything lives in OUT/work (ignored by git): plan.json (the recipe; a re-run must match it), state.json (how
far each phase got), data/*.pt (shards of target-written samples), ckpt.pt (draft and optimizer). A re-run
continues where the last one stopped. The budget is --minutes, split between writing data and training
(--data-share); --shards / --steps replace it with exact counts, which is how a draft is reproduced: same seed,
same shards, same steps -> the same weights (on a CPU; CUDA kernels need not be bitwise deterministic). A
trained draft can be trained on with a larger --steps (a new leg of the schedule; state.json keeps the legs).
--data-only stops once the data is written (training may follow later, even on another machine); the data stays
open to more shards until training begins, and --reopen opens it again (the trained draft's checkpoint is
dropped: the head rows and the training are redone on all the data, so the reproducing commands still hold).
The target writes in --teacher-dtype: bfloat16 where the hardware has fast bfloat16 units (2.3x faster on an AMX
CPU; its greedy next token agrees with float32's at 98% of positions), else float32. It answers --prompts: plain
chat requests (chat, the default) or templated ones (templates, what the first drafts learnt from). Each shard's
dtype and prompt set are kept in state.json, and the reproducing commands name them. Each prompt set has its own
held-out shard, written by the first run that uses the set.
The draft itself (config.json, model.safetensors, draft_vocab.json, distill.json) is written to OUT when a run
ends, however it ends.
"""
from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from peers.models import source as models
from peers.conversation.chat import eos_ids, load_tokenizer
from peers.models.fingerprint import config_fingerprint
from peers.compute.memory import default_device
from peers.compute.loading import load_config
from peers.speculation.drafting import feature_net
from peers.distill import teacher, train, weights

RECIPE = {"seed": 0, "layers": 1, "vocab": 8192, "batch": None, "max_new": 256}  # None: per device
CHECKPOINT_EVERY_S = 60.0


@dataclass
class Options:
    model: str | None
    out: Path
    minutes: float = 60.0
    data_share: float = 0.75
    shards: int | None = None  # exact number of training shards instead of the time budget
    steps: int | None = None  # exact number of training steps instead of the time budget
    device: str | None = None
    seed: int | None = None  # recipe options: None takes the plan's value on a re-run, else RECIPE's
    layers: int | None = None
    vocab: int | None = None
    batch: int | None = None
    max_new: int | None = None
    teacher_dtype: str | None = None  # for the shards this run writes; None: fast_dtype(device)
    prompt_set: str = "chat"  # for the shards this run writes: one of teacher.PROMPT_SETS
    data_only: bool = False
    reopen: bool = False  # grow data a draft was already trained on to `shards`; training starts over


def _save(obj, path: Path) -> None:
    """Write atomically: an interrupted run never leaves half a file behind."""
    tmp = path.with_name(path.name + ".tmp")
    if path.suffix == ".json":
        tmp.write_text(json.dumps(obj, indent=1))
    else:
        torch.save(obj, tmp)
    os.replace(tmp, path)


def fast_dtype(device: str) -> str:
    """bfloat16 where matrix products in it are fast (CUDA with bf16, a CPU with AVX512-BF16 or AMX), else float32:
    a CPU without bfloat16 units emulates it, slower than float32."""
    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    return "bfloat16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "float32"


def reproduce(out: Path, model: str, plan: dict, kinds: list[tuple[str, str]], legs: list[int]) -> str:
    """The commands that rewrite this data (one per run of shards of one kind: (dtype, prompt set)) and train it
    in legs: one run per --steps the training was continued to (each decays its rate to its own end)."""
    def command(shards, kind, tail):
        return (f"sfchat distill --model {model} --out {out} --seed {plan['seed']} --layers {plan['layers']} "
                f"--vocab {plan['vocab']} --batch {plan['batch']} --max-new-tokens {plan['max_new']} "
                f"--teacher-dtype {kind[0]} --prompts {kind[1]} --shards {shards} {tail}")
    ends = [i + 1 for i in range(len(kinds)) if i + 1 == len(kinds) or kinds[i + 1] != kinds[i]]
    lines = [command(end, kinds[end - 1], "--data-only") for end in ends]
    if legs:
        lines[-1] = lines[-1].replace("--data-only", f"--steps {legs[0]}")
        lines += [command(len(kinds), kinds[-1], f"--steps {steps}") for steps in legs[1:]]
    return " && ".join(lines)


def held_out_samples(work: Path) -> list[dict]:
    """The held-out shards' samples (topics never trained on): one shard per prompt set the data uses."""
    return [s for path in sorted((work / "data").glob("eval-*.pt")) for s in torch.load(path)]


def _plan(o: Options, work: Path, target_dir: Path, device: str) -> dict:
    path = work / "plan.json"
    old = json.loads(path.read_text()) if path.is_file() else None
    plan = {"target_config": config_fingerprint(target_dir)}
    for key, default in RECIPE.items():
        given = getattr(o, key)
        plan[key] = given if given is not None else old[key] if old else default
    if plan["batch"] is None:
        plan["batch"] = 256 if device.startswith("cuda") else 128
    if old is not None and old != plan:
        diff = ", ".join(f"{k} {old.get(k)} (now {plan[k]})" for k in plan if old.get(k) != plan[k])
        raise ValueError(f"{work.parent} holds a distillation with other options: {diff}; "
                         "use the same options or another --out")
    _save(plan, path)
    return plan


def distill(o: Options, progress=lambda phase, done, total, note: None, say=print) -> dict:
    """Run (or continue) a distillation; returns the exported draft's summary (also in OUT/distill.json), or with
    --data-only, before training, what the data holds."""
    if o.reopen and o.shards is None:
        raise ValueError("--reopen needs --shards: the number of shards the data is to grow to")
    run = Run.open(o, say)
    run.reopen()
    _write_data(run, progress)  # 1. the target writes
    data = _read_data(run, progress)
    if o.data_only and run.state["vocab"] is None:
        return _data_summary(run, data)
    ids = _head_rows(run, data.samples)  # 2. the draft's head rows, and its initialisation
    run.target = None  # training needs only the data and the target's files: free its memory
    agreement = _agreement(run, ids, data.held_out)
    model, opt = _draft(run, ids, agreement)
    loss = _train(run, model, opt, data.samples, progress)  # 3. training
    return _export(run, model, ids, data, loss, agreement)  # 4. export


@dataclass
class Run:
    """One run of a distillation: its options, the target, and OUT/work (the plan, and how far each phase got)."""

    o: Options
    target_dir: Path
    device: str
    plan: dict
    state: dict
    tok: object
    dtype: str  # the target's, for the shards this run writes
    say: Callable = print
    target: torch.nn.Module | None = None  # loaded only when a shard is to be written

    @classmethod
    def open(cls, o: Options, say) -> Run:
        target_dir = models.resolve(o.model, say=say)
        device = o.device or default_device()
        work = Path(o.out) / "work"
        (work / "data").mkdir(parents=True, exist_ok=True)
        (work / ".gitignore").write_text("*\n")  # data and checkpoints stay out of the repository
        plan = _plan(o, work, target_dir, device)
        return cls(o, target_dir, device, plan, _state(work), load_tokenizer(target_dir),
                   o.teacher_dtype or fast_dtype(device), say)

    @property
    def work(self) -> Path:
        return Path(self.o.out) / "work"

    def save_state(self) -> None:
        _save(self.state, self.work / "state.json")

    def reopen(self) -> None:
        """--reopen: drop the trained draft, so that the head rows and the training are redone on all the data. Only
        while more shards are asked for, so that the same command run again resumes the new training."""
        if self.o.reopen and self.state["vocab"] is not None and self.o.shards > self.state["shards"]:
            (self.work / "ckpt.pt").unlink(missing_ok=True)
            self.state.update(vocab=None, step=0, train_s=0.0, agreement_init=None, legs=[])
            self.save_state()
            self.say(f"the data is open again at {self.state['shards']} shards; the draft trained on them is dropped "
                     "and training starts over (the exported draft stays until then)")

    def shard(self, split: str, index: int) -> Path:
        """A shard of target-written samples, written now unless an earlier run did."""
        path = self.work / "data" / f"{split}-{index:05d}.pt"
        if path.is_file():
            return path
        if self.target is None:
            from transformers import AutoModelForCausalLM

            self.target = AutoModelForCausalLM.from_pretrained(self.target_dir, dtype=getattr(torch, self.dtype))
            self.target = self.target.to(self.device).eval()
        m, plan = self.target, self.plan
        t0 = time.perf_counter()
        samples = teacher.write_shard(m, self.tok, eos_ids(self.target_dir, m.config, self.tok), seed=plan["seed"],
                                      split=split, index=index, batch=plan["batch"], max_new=plan["max_new"],
                                      prompt_set=self.o.prompt_set)
        _save([{k: v for k, v in s.items() if k != "text"} for s in samples], path)
        if split == "train":  # a held-out shard is written in the dtype of the first run of its prompt set
            self.state["dtypes"].append(self.dtype)
            self.state["prompt_sets"].append(self.o.prompt_set)
        self.state["data_s"] += time.perf_counter() - t0
        self.save_state()
        return path

    def reproduce(self, legs: list[int]) -> str:
        kinds = list(zip(self.state["dtypes"], self.state["prompt_sets"]))
        return reproduce(Path(self.o.out), self.o.model or models.DEFAULT_MODEL, self.plan, kinds, legs)


def _state(work: Path) -> dict:
    """How far each phase got (state.json), with what older runs did not record filled in."""
    path = work / "state.json"
    state = json.loads(path.read_text()) if path.is_file() else \
        {"shards": 0, "data_s": 0.0, "vocab": None, "step": 0, "train_s": 0.0, "agreement_init": None}
    state.setdefault("dtypes", ["float32"] * state["shards"])  # runs before --teacher-dtype wrote float32
    state.setdefault("prompt_sets", ["templates"] * state["shards"])  # and before --prompts, templates
    state.setdefault("legs", [state["step"]] if state["step"] else [])  # and before legs, one --steps run
    return state


def _write_data(run: Run, progress) -> None:
    """A held-out shard (topics never trained on), then training shards up to --shards or the data's share of the
    budget. Once training has begun the data is closed."""
    o, state = run.o, run.state
    data_budget = o.minutes * 60 * o.data_share
    if state["vocab"] is None:
        run.shard("eval", teacher.PROMPT_SETS.index(o.prompt_set))
    while state["vocab"] is None and (state["shards"] < o.shards if o.shards is not None
                                      else state["shards"] == 0 or state["data_s"] < data_budget):
        progress("data", *((state["shards"], o.shards) if o.shards is not None else (state["data_s"], data_budget)),
                 f"shard {state['shards'] + 1}")
        run.shard("train", state["shards"])
        state["shards"] += 1
        run.save_state()
    if state["vocab"] is not None and o.shards is not None and o.shards != state["shards"]:
        run.say(f"the data was fixed at {state['shards']} shards when training began; --shards {o.shards} is "
                "ignored (--reopen adds shards and trains again from the start)")


@dataclass
class Data:
    samples: list[dict]  # the training shards'
    held_out: list[dict]
    written: int  # target-written tokens in the training samples


def _read_data(run: Run, progress) -> Data:
    samples = [s for i in range(run.state["shards"]) for s in torch.load(run.work / "data" / f"train-{i:05d}.pt")]
    written = sum(len(s["ids"]) - s["start"] for s in samples)
    progress("data", 1, 1, f"{run.state['shards']} shards, {written:,} target-written tokens")
    return Data(samples, held_out_samples(run.work), written)


def _data_summary(run: Run, data: Data) -> dict:
    state = run.state
    return {"target": run.target_dir.name, "shards": state["shards"], "written_tokens": data.written,
            "data_minutes": round(state["data_s"] / 60, 2), "dtypes": state["dtypes"],
            "prompt_sets": state["prompt_sets"], "reproduce": run.reproduce([])}


def _head_rows(run: Run, samples: list[dict]) -> list[int]:
    """The target ids the draft's head has rows for: the most frequent in the data, and every end-of-sequence or
    special token. Chosen when training begins, fixed from then on (the data is closed)."""
    if run.state["vocab"] is None:
        vocab_size = load_config(run.target_dir).vocab_size
        counts = torch.bincount(torch.cat([s["ids"][s["start"]:].long() for s in samples]), minlength=vocab_size)
        special = eos_ids(run.target_dir, load_config(run.target_dir), run.tok) | set(run.tok.all_special_ids)
        always = {i for i in special if i < vocab_size}
        run.state["vocab"] = weights.choose_vocab(counts, run.plan["vocab"], always)
        run.save_state()
    return run.state["vocab"]


def _agreement(run: Run, ids: list[int], held_out: list[dict]):
    """How often a draft's top token is the target's own greedy choice on the held-out data (train.agreement)."""
    to_row = torch.full((load_config(run.target_dir).vocab_size,), -1, dtype=torch.long)  # target id -> head row
    to_row[torch.tensor(ids)] = torch.arange(len(ids))  # (-1: not in the head)
    head = feature_net.target_head(run.target_dir)  # the full head: the target's own greedy choice
    return lambda model: train.agreement(model, held_out, head, to_row, run.device)


def _draft(run: Run, ids: list[int], agreement) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The draft and its optimizer: from the checkpoint, or initialised from the target's last layers (with its
    agreement before any training)."""
    ckpt = run.work / "ckpt.pt"
    if ckpt.is_file():
        saved = torch.load(ckpt, map_location="cpu")  # a run may move between a GPU and a CPU machine
        model = feature_net.build(run.target_dir, weights.body_config(run.target_dir, run.plan["layers"]), ids,
                                  saved["model"])
        model.to(run.device)
        opt = train.optimizer(model)
        opt.load_state_dict(saved["opt"])
        return model, opt
    model = weights.init_draft(run.target_dir, ids, run.plan["layers"], run.plan["seed"]).to(run.device)
    opt = train.optimizer(model)
    run.state["agreement_init"] = agreement(model)
    return model, opt


def _train(run: Run, model, opt, samples: list[dict], progress) -> float:
    """Train to --steps or to the end of the budget; returns the last step's loss (nan: none). The draft and its
    optimizer are saved every minute and when training stops, however it stops (unless Ctrl-C cut a step in
    half): the next run continues from there."""
    o, state = run.o, run.state

    def checkpoint():
        _save({"model": weights.own_state(model), "opt": opt.state_dict()}, run.work / "ckpt.pt")
        run.save_state()

    train_budget = max(o.minutes * 60 - state["data_s"], 0.0)
    done = (lambda: state["step"] >= o.steps) if o.steps is not None else (lambda: state["train_s"] >= train_budget)
    if o.steps is not None and state["step"] < o.steps and state["legs"][-1:] != [o.steps]:
        state["legs"].append(o.steps)  # a new leg: its steps decay to o.steps (a resumed leg is the same one)
    last_save, loss, between_steps = time.monotonic(), math.nan, True
    try:
        while not done():
            t0 = time.perf_counter()
            between_steps = False
            loss = train.step(model, opt, samples, run.plan["seed"], state["step"], run.device, o.steps)
            state["step"] += 1
            state["train_s"] += time.perf_counter() - t0
            between_steps = True
            progress("train", *((state["step"], o.steps) if o.steps is not None else (state["train_s"], train_budget)),
                     f"step {state['step']}, loss {loss:.3f}")
            if time.monotonic() - last_save > CHECKPOINT_EVERY_S:
                checkpoint()
                last_save = time.monotonic()
    finally:  # also on Ctrl-C (unless it cut a step in half)
        if between_steps:
            checkpoint()
    return loss


def _export(run: Run, model, ids: list[int], data: Data, loss: float, agreement) -> dict:
    """The draft into OUT, with its summary: what it was made from and how, how well it agrees with its target,
    and the commands that make it again."""
    plan, state = run.plan, run.state
    summary = {"target": run.target_dir.name, "target_config": plan["target_config"],
               "tokenizer": feature_net.tokenizer_fingerprint(run.tok), **{k: plan[k] for k in RECIPE},
               "shards": state["shards"], "steps": state["step"], "written_tokens": data.written,
               "data_minutes": round(state["data_s"] / 60, 2), "train_minutes": round(state["train_s"] / 60, 2),
               "device": run.device, "agreement_init": [round(a, 4) for a in state["agreement_init"]],
               "agreement": [round(a, 4) for a in agreement(model)],
               "loss": None if math.isnan(loss) else round(loss, 4)}
    summary["teacher_dtypes"] = {d: state["dtypes"].count(d) for d in dict.fromkeys(state["dtypes"])}
    summary["prompt_sets"] = {p: state["prompt_sets"].count(p) for p in dict.fromkeys(state["prompt_sets"])}
    # an interrupted leg is named whole: its command finishes it; a time-budget run is named by its steps
    summary["reproduce"] = run.reproduce(state["legs"] or [state["step"]])
    weights.save_draft(model, ids, Path(run.o.out), summary)
    return summary
