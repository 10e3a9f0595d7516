"""Fault -> next token: a greedy answer streams from a host and local peers on this machine while one member is
killed (SIGKILL) or stopped (SIGSTOP); the seconds from the fault to the next round of tokens delivered, and the
answer checked against an undisturbed one. A fresh ring for each trial.

    python scripts/fault_to_token.py [--model smollm2-135m] [--trials 3] [--faults kill,stop] [--peers 2]
                                     [--placement memory]

The victim is a member that holds layers (placement by speed may leave one out as a spare on a small machine:
--placement memory, the default here, gives every member its share).

Prints one line per trial, then p50/p99/max per fault (docs/reliability.md).
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import sys
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peers.base.options import HostOptions  # noqa: E402
from peers.conversation.chat import Chat, eos_ids, load_tokenizer  # noqa: E402
from peers.host.host import Host  # noqa: E402
from peers.speculation.adaptive import KPolicy  # noqa: E402
from peers.speculation.drafting import Drafter  # noqa: E402
from peers.speculation.sampling import SamplingParams  # noqa: E402
from sfchat.local import LocalPeers, local_name  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper."


async def answer(host, on_round=None, n=48) -> list[int]:
    tok = load_tokenizer(host.model_dir)
    chat = Chat(host, tok, eos_ids(host.model_dir, host.config, tok))
    _, r = await chat.reply(PROMPT, drafter=Drafter(), params=SamplingParams(), policy=KPolicy(),
                            max_new_tokens=n, on_round=on_round)
    return r.token_ids


async def trial(model: str, fault: str, n_peers: int, reference: list[int] | None,
                placement: str) -> tuple[float, bool, list]:
    host = Host(HostOptions(model, placement=placement), say=lambda *a: None)
    async with trio.open_nursery() as nursery:
        await nursery.start(host.serve)
        host.auto_replan = True
        with LocalPeers(n_peers, host.address, host.token, model=model) as lp:
            await host.roster.wait(n_peers, 300)
            await host.replan()
            if reference is None:
                reference = await answer(host)
            rounds, at, back = 0, None, None
            holding = {m.name for m in host.members if m.span is not None}
            victim = random.choice([p for i, p in enumerate(lp.procs) if local_name(i) in holding])

            def on_round(ev):
                nonlocal rounds, at, back
                if ev["event"] != "round":
                    return
                rounds += 1
                if at is not None and back is None:
                    back = time.monotonic() - at
                if rounds == 6:
                    victim.send_signal(signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
                    at = time.monotonic()

            ids = await answer(host, on_round)
            if fault == "stop" and victim.poll() is None:
                os.kill(victim.pid, signal.SIGCONT)
            await host.close()
        nursery.cancel_scope.cancel()
    return back, ids == reference, reference


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--faults", default="kill,stop")
    p.add_argument("--peers", type=int, default=2)
    p.add_argument("--placement", default="memory", choices=("memory", "speed"))
    a = p.parse_args()
    reference, took = None, {}
    for fault in a.faults.split(","):
        for i in range(a.trials):
            back, exact, reference = trio.run(trial, a.model, fault, a.peers, reference, a.placement)
            took.setdefault(fault, []).append(back)
            print(f"{fault} {i + 1}: next token {back:.2f} s after the fault, answer {'exact' if exact else 'WRONG'}",
                  flush=True)
    for fault, xs in took.items():
        xs = sorted(xs)
        print(f"{fault}: p50 {statistics.median(xs):.2f} s, p99 {xs[min(len(xs) - 1, int(0.99 * len(xs)))]:.2f} s, "
              f"max {xs[-1]:.2f} s over {len(xs)}")


if __name__ == "__main__":
    main()
