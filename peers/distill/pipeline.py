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
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import models
from ..chat import eos_ids, load_tokenizer
from ..fingerprint import config_fingerprint
from ..memory import default_device
from ..shard import load_config
from ..drafting import feature_net
from . import teacher, train, weights

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
    """Run (or continue) a distillation; returns the exported draft's summary (also in OUT/distill.json)."""
    target_dir = models.resolve(o.model, say=say)
    device = o.device or default_device()
    out = Path(o.out)
    work = out / "work"
    (work / "data").mkdir(parents=True, exist_ok=True)
    (work / ".gitignore").write_text("*\n")  # data and checkpoints stay out of the repository
    plan = _plan(o, work, target_dir, device)
    state_path = work / "state.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else \
        {"shards": 0, "data_s": 0.0, "vocab": None, "step": 0, "train_s": 0.0, "agreement_init": None}
    state.setdefault("dtypes", ["float32"] * state["shards"])  # runs before --teacher-dtype wrote float32
    state.setdefault("prompt_sets", ["templates"] * state["shards"])  # and before --prompts, templates
    state.setdefault("legs", [state["step"]] if state["step"] else [])  # and before legs, one --steps run
    if o.reopen and o.shards is None:
        raise ValueError("--reopen needs --shards: the number of shards the data is to grow to")
    # only while more shards are asked for, so that the same command run again resumes the new training
    if o.reopen and state["vocab"] is not None and o.shards > state["shards"]:  # head rows come from all the data
        (work / "ckpt.pt").unlink(missing_ok=True)
        state.update(vocab=None, step=0, train_s=0.0, agreement_init=None, legs=[])
        _save(state, state_path)
        say(f"the data is open again at {state['shards']} shards; the draft trained on them is dropped and "
            "training starts over (the exported draft stays until then)")
    dtype = o.teacher_dtype or fast_dtype(device)
    tok = load_tokenizer(target_dir)
    seed = plan["seed"]
    target = None

    def kinds():
        return list(zip(state["dtypes"], state["prompt_sets"]))

    def load_target():
        nonlocal target
        if target is None:
            from transformers import AutoModelForCausalLM

            target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=getattr(torch, dtype)).to(device).eval()
        return target

    def shard(split: str, index: int) -> Path:
        path = work / "data" / f"{split}-{index:05d}.pt"
        if not path.is_file():
            m = load_target()
            t0 = time.perf_counter()
            samples = teacher.write_shard(m, tok, eos_ids(target_dir, m.config, tok), seed=seed, split=split,
                                          index=index, batch=plan["batch"], max_new=plan["max_new"],
                                          prompt_set=o.prompt_set)
            _save([{k: v for k, v in s.items() if k != "text"} for s in samples], path)
            if split == "train":  # a held-out shard is written in the dtype of the first run of its prompt set
                state["dtypes"].append(dtype)
                state["prompt_sets"].append(o.prompt_set)
            state["data_s"] += time.perf_counter() - t0
            _save(state, state_path)
        return path

    # 1. the target writes: a held-out shard (topics never trained on), then training shards
    data_budget = o.minutes * 60 * o.data_share
    if state["vocab"] is None:
        shard("eval", teacher.PROMPT_SETS.index(o.prompt_set))
    while state["vocab"] is None and (state["shards"] < o.shards if o.shards is not None
                                      else state["shards"] == 0 or state["data_s"] < data_budget):
        progress("data", *((state["shards"], o.shards) if o.shards is not None else (state["data_s"], data_budget)),
                 f"shard {state['shards'] + 1}")
        shard("train", state["shards"])
        state["shards"] += 1
        _save(state, state_path)
    if state["vocab"] is not None and o.shards is not None and o.shards != state["shards"]:
        say(f"the data was fixed at {state['shards']} shards when training began; --shards {o.shards} is ignored "
            "(--reopen adds shards and trains again from the start)")
    samples = [s for i in range(state["shards"]) for s in torch.load(work / "data" / f"train-{i:05d}.pt")]
    held_out = held_out_samples(work)
    written = sum(len(s["ids"]) - s["start"] for s in samples)
    progress("data", 1, 1, f"{state['shards']} shards, {written:,} target-written tokens")
    model_name = o.model or models.DEFAULT_MODEL
    if o.data_only and state["vocab"] is None:
        return {"target": target_dir.name, "shards": state["shards"], "written_tokens": written,
                "data_minutes": round(state["data_s"] / 60, 2), "dtypes": state["dtypes"],
                "prompt_sets": state["prompt_sets"], "reproduce": reproduce(out, model_name, plan, kinds(), [])}

    # 2. the draft's head rows (fixed from here on: the data is closed) and its initialisation
    vocab_size = load_config(target_dir).vocab_size
    if state["vocab"] is None:
        counts = torch.bincount(torch.cat([s["ids"][s["start"]:].long() for s in samples]), minlength=vocab_size)
        always = {i for i in eos_ids(target_dir, load_config(target_dir), tok) | set(tok.all_special_ids)
                  if i < vocab_size}
        state["vocab"] = weights.choose_vocab(counts, plan["vocab"], always)
        _save(state, state_path)
    ids = state["vocab"]
    to_row = torch.full((vocab_size,), -1, dtype=torch.long)  # target id -> head row (-1: not in the head)
    to_row[torch.tensor(ids)] = torch.arange(len(ids))
    head = feature_net.target_head(target_dir)  # the full head: the target's own greedy choice, for agreement
    target = None  # training needs only the data and the target's files: free its memory
    ckpt = work / "ckpt.pt"
    if ckpt.is_file():
        saved = torch.load(ckpt, map_location="cpu")  # a run may move between a GPU and a CPU machine
        model = feature_net.build(target_dir, weights.body_config(target_dir, plan["layers"]), ids, saved["model"])
        model.to(device)
        opt = train.optimizer(model)
        opt.load_state_dict(saved["opt"])
    else:
        model = weights.init_draft(target_dir, ids, plan["layers"], seed).to(device)
        opt = train.optimizer(model)
        state["agreement_init"] = train.agreement(model, held_out, head, to_row, device)

    def checkpoint():
        _save({"model": weights.own_state(model), "opt": opt.state_dict()}, ckpt)
        _save(state, state_path)

    # 3. training
    train_budget = max(o.minutes * 60 - state["data_s"], 0.0)
    done = (lambda: state["step"] >= o.steps) if o.steps is not None else (lambda: state["train_s"] >= train_budget)
    if o.steps is not None and state["step"] < o.steps and state["legs"][-1:] != [o.steps]:
        state["legs"].append(o.steps)  # a new leg: its steps decay to o.steps (a resumed leg is the same one)
    last_save, loss, between_steps = time.monotonic(), math.nan, True
    try:
        while not done():
            t0 = time.perf_counter()
            between_steps = False
            loss = train.step(model, opt, samples, seed, state["step"], device, o.steps)
            state["step"] += 1
            state["train_s"] += time.perf_counter() - t0
            between_steps = True
            progress("train", *((state["step"], o.steps) if o.steps is not None else (state["train_s"], train_budget)),
                     f"step {state['step']}, loss {loss:.3f}")
            if time.monotonic() - last_save > CHECKPOINT_EVERY_S:
                checkpoint()
                last_save = time.monotonic()
    finally:  # also on Ctrl-C (unless it cut a step in half): the next run continues from here
        if between_steps:
            checkpoint()

    # 4. export
    summary = {"target": target_dir.name, "target_config": plan["target_config"],
               "tokenizer": feature_net.tokenizer_fingerprint(tok), **{k: plan[k] for k in RECIPE},
               "shards": state["shards"], "steps": state["step"], "written_tokens": written,
               "data_minutes": round(state["data_s"] / 60, 2), "train_minutes": round(state["train_s"] / 60, 2),
               "device": device, "agreement_init": [round(a, 4) for a in state["agreement_init"]],
               "agreement": [round(a, 4) for a in train.agreement(model, held_out, head, to_row, device)],
               "loss": None if math.isnan(loss) else round(loss, 4)}
    summary["teacher_dtypes"] = {d: state["dtypes"].count(d) for d in dict.fromkeys(state["dtypes"])}
    summary["prompt_sets"] = {p: state["prompt_sets"].count(p) for p in dict.fromkeys(state["prompt_sets"])}
    # an interrupted leg is named whole: its command finishes it; a time-budget run is named by its steps
    summary["reproduce"] = reproduce(out, model_name, plan, kinds(), state["legs"] or [state["step"]])
    weights.save_draft(model, ids, out, summary)
    return summary

