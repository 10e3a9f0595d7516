"""Where a shared round's time goes: N conversations answering at once through a ring of local peers over a shaped
link (the bench's prompts, greedy, the shipped draft, no HTTP), each round's milliseconds averaged past the
prompts' first rounds: drafting on the critical path, the host (its layers, the head, verification), the peers,
the link.

    python scripts/shared_rounds.py [--rtt-ms 86] [--clients 1,4,8] [--local-peers 2]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peers.speculation.adaptive import KPolicy  # noqa: E402
from peers.conversation.chat import render  # noqa: E402
from peers.speculation.generate import generate  # noqa: E402
from peers.base.options import HostOptions  # noqa: E402
from peers.speculation.sampling import SamplingParams  # noqa: E402
from sfchat.bench import DEFAULT_PROMPTS  # noqa: E402
from sfchat.options import RingOptions  # noqa: E402
from sfchat.runtime import new_drafter, open_ring  # noqa: E402
from sfchat.shaped_relay import shaped_relay  # noqa: E402


async def answer_all(ring, drafter, n: int, rounds: list) -> float:
    policy = KPolicy()  # one policy for the conversations that share passes, as `sfchat serve` keeps

    async def one() -> None:
        for prompt in DEFAULT_PROMPTS:
            rs, d = ring.host.new_session(uuid.uuid4().hex[:12]), drafter.fork()
            try:
                await generate(ring.host, rs, render(ring.tokenizer, [{"role": "user", "content": prompt}]),
                               drafter=d, params=SamplingParams(), policy=policy, max_new_tokens=64, eos=ring.eos,
                               on_round=lambda ev: ev.get("event") == "round" and rounds.append(ev["round"]))
            finally:
                d.close()
                await ring.host.drop(rs)

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(one)
    return time.perf_counter() - t0


async def main(a) -> None:
    async with shaped_relay(a.rtt_ms / (a.local_peers + 1)) as relay:
        opts = RingOptions(HostOptions(relay=relay), local_peers=a.local_peers)
        async with open_ring(opts, announce=False) as ring:
            drafter = await new_drafter(None, ring)
            print(f"{a.rtt_ms:g} ms, {a.local_peers} local peers; ms per round")
            print("| clients | tok/s | tokens/round | per pass | drafts | drafting | host | peers | link |")
            print("|---|---|---|---|---|---|---|---|---|")
            for n in a.clients:
                rounds: list[dict] = []
                seconds = await answer_all(ring, drafter, n, rounds)
                later = rounds[n * len(DEFAULT_PROMPTS):] or rounds  # roughly past each prompt's first round

                def mean(f):
                    return statistics.mean(f(r) for r in later)
                tps = sum(r["committed"] for r in rounds) / seconds
                print(f"| {n} | {tps:.2f} | {mean(lambda r: r['committed']):.2f}"
                      f" | {mean(lambda r: r['batch']):.2f} | {mean(lambda r: r['drafted']):.1f}"
                      f" | {mean(lambda r: r['draft_ms']):.0f} | {mean(lambda r: r['host_ms']):.0f}"
                      f" | {mean(lambda r: sum(ms for _, ms in r['peers'])):.0f}"
                      f" | {mean(lambda r: r['network_ms']):.0f} |",
                      flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rtt-ms", type=float, default=86.0)
    p.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 8])
    p.add_argument("--local-peers", type=int, default=2)
    trio.run(main, p.parse_args())
