"""`sfchat distill`: arguments and a progress bar around peers.distill.pipeline."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def add_arguments(p) -> None:
    p.add_argument("--out", required=True, type=Path, help="directory for the draft (and its work/ to resume from)")
    p.add_argument("--minutes", type=float, default=60.0, help="time budget for writing data and training")
    p.add_argument("--seed", type=int, help="seed of prompts, sampling and training (default: 0)")
    p.add_argument("--data-share", type=float, default=0.75, help="part of the budget spent writing data")
    p.add_argument("--shards", type=int, help="write exactly N training shards (instead of the time budget)")
    p.add_argument("--steps", type=int, help="train to exactly N steps in all (instead of the time budget); "
                   "a larger N continues a trained draft (a new leg of its schedule)")
    p.add_argument("--layers", type=int,
                   help="decoder layers of the draft, initialised from the target's last ones (default: 1)")
    p.add_argument("--vocab", type=int, help="the draft's vocabulary: most frequent target tokens (default: 8192)")
    p.add_argument("--batch", type=int,
                   help="conversations the target answers at once (default: 128 on a CPU, 256 on CUDA)")
    p.add_argument("--max-new-tokens", type=int, dest="max_new", help="longest answer the target writes (default: 256)")
    p.add_argument("--teacher-dtype", choices=["float32", "bfloat16"],
                   help="the target's dtype for the shards this run writes (bfloat16 where the hardware is fast at it)")
    p.add_argument("--prompts", choices=["chat", "templates"], default="chat", dest="prompt_set",
                   help="what the target answers in the shards this run writes: plain chat requests (chat) or the "
                        "templated set of the first drafts")
    p.add_argument("--data-only", action="store_true", help="stop once the data is written; train in a later run")
    p.add_argument("--reopen", action="store_true",
                   help="grow data a draft was already trained on to --shards; its training then starts over")


def run(args) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from peers.distill.pipeline import Options, distill

    opts = Options(model=args.model, out=args.out, minutes=args.minutes, data_share=args.data_share,
                   shards=args.shards, steps=args.steps, device=args.device, seed=args.seed, layers=args.layers,
                   vocab=args.vocab, batch=args.batch, max_new=args.max_new, teacher_dtype=args.teacher_dtype,
                   prompt_set=args.prompt_set, data_only=args.data_only, reopen=args.reopen)
    console = Console(stderr=True)
    labels = {"data": "target writes", "train": "draft learns"}
    with Progress(TextColumn("{task.description:<14}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  TimeElapsedColumn(), TextColumn("{task.fields[note]}"), console=console) as bar:
        tasks: dict[str, int] = {}

        def progress(phase, done, total, note):
            if phase not in tasks:
                tasks[phase] = bar.add_task(labels[phase], total=1.0, note="")
            bar.update(tasks[phase], completed=min(done / total, 1.0) if total else 1.0, note=note)

        try:
            summary = distill(opts, progress=progress, say=lambda *a: console.print(*a))
        except KeyboardInterrupt:
            console.print(f"interrupted: run the same command to continue from {args.out}/work")
            raise
    print(json.dumps(summary, indent=1), file=sys.stdout)
    if "agreement" not in summary:
        console.print(f"{summary['shards']} shards written to {args.out}/work: run without --data-only to train")
        return 0
    (a1, a2), (b1, b2) = summary["agreement_init"], summary["agreement"]
    console.print(f"draft written to {args.out}: held-out agreement with the target {b1:.3f} on a round's first "
                  f"draft, {b2:.3f} on later ones (at the start: {a1:.3f}, {a2:.3f})")
    return 0
