#!/usr/bin/env python
"""What the relay itself costs: round trips on loopback, direct vs through an unshaped `sfchat relay` process.

    .venv/bin/python scripts/bench_relay.py [--n 2000]

The payload sizes are a ping and a decode step's hidden-state frame (SmolLM2-135M: 576 float32 + header).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from peers.links import dial as links  # noqa: E402


async def echo(stream) -> None:
    while data := await stream.receive_some(65536):
        await stream.send_all(data)


async def round_trips(stream, n: int, size: int) -> list[float]:
    msg, out = os.urandom(size), []
    for _ in range(n):
        t0 = time.perf_counter()
        await stream.send_all(msg)
        got = 0
        while got < size:
            got += len(await stream.receive_some(65536))
        out.append((time.perf_counter() - t0) * 1e3)
    return out


async def main(n: int) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "sfchat", "relay", "--listen", "127.0.0.1:0"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        relay = proc.stdout.readline().split()[3]
        async with trio.open_nursery() as nursery:
            got = await nursery.start(links.serve, echo, "127.0.0.1:0", relay, "bench/echo")
            direct = await links.dial(f"127.0.0.1:{got.port}")
            relayed = await links.dial(got.relay_address)
            print(f"{'payload':>10} {'direct ms':>10} {'relay ms':>10} {'added ms':>10}   (medians of {n} round trips)")
            for size in (64, 576 * 4 + 200):
                await round_trips(direct, 50, size)
                await round_trips(relayed, 50, size)
                d = statistics.median(await round_trips(direct, n, size))
                r = statistics.median(await round_trips(relayed, n, size))
                print(f"{size:>8} B {d:>10.3f} {r:>10.3f} {r - d:>10.3f}")
            nursery.cancel_scope.cancel()
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    trio.run(main, ap.parse_args().n)
