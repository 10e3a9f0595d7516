"""What the hops cost a long prefill: the same pass through a host alone (one process) and through a host and local
peers on this machine, on a model of Qwen2.5-7B's width (hidden 3584, its MLP and heads; few layers, random
weights, built once under --models).

    python scripts/prefill_hops.py [--tokens 6000] [--layers 3] [--intermediate N] [--peers 2] [--repeats 3]
                                   [--ref REV]

--ref REV runs the same measurement on the code of git revision REV (exported to a temporary directory), so a
change is measured before and after on the same machine: run it with --ref of the revision before, then without.
The layers are split evenly (the host's share first); each run prints its seconds and the host's, the members'
and the network's part of them, then the medians.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTH = dict(hidden=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4)  # Qwen2.5-7B


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=6000, help="positions in the prefill (default 6000)")
    p.add_argument("--layers", type=int, default=3, help="decoder layers of the model (default 3)")
    p.add_argument("--intermediate", type=int, default=WIDTH["intermediate_size"],
                   help="MLP width (default Qwen2.5-7B's 18944; a narrower one spares the CPU and leaves the hops a "
                   "larger share)")
    p.add_argument("--peers", type=int, default=2, help="local peers in the ring (default 2)")
    p.add_argument("--repeats", type=int, default=3, help="prefills timed in each setting (default 3)")
    p.add_argument("--models", type=Path, default=Path(tempfile.gettempdir()) / "sfchat-prefill-models",
                   help="where the random model is built once")
    p.add_argument("--ref", help="measure the code of this git revision instead of the working tree")
    p.add_argument("--code", type=Path, default=ROOT, help=argparse.SUPPRESS)  # (--ref: the exported tree)
    a = p.parse_args()
    model = build_model(a.models, a.layers, a.intermediate, a.tokens)
    if a.ref:
        sys.exit(run_at(a.ref, model, a))
    sys.path.insert(0, str(a.code))
    import trio

    print(f"{a.tokens}-token prefill, {a.layers} layers of Qwen2.5-7B's width (MLP {a.intermediate}), code at "
          f"{describe(a.code)}, {os.cpu_count()} CPUs", flush=True)
    alone = trio.run(measure, model, 0, a)
    ring = trio.run(measure, model, a.peers, a)
    print(f"median: one process {alone:.2f} s, host + {a.peers} peers {ring:.2f} s ({ring / alone:.2f}x)")


def build_model(models: Path, layers: int, intermediate: int, tokens: int) -> Path:
    path = models / f"qwen2-3584-{intermediate}-{layers}l"
    if not (path / "config.json").exists():
        sys.path.insert(0, str(ROOT / "tests"))
        from tiny import make_model

        print(f"building a random {layers}-layer model of Qwen2.5-7B's width in {path}", flush=True)
        make_model(path, "qwen2", layers=layers, max_position_embeddings=max(32768, tokens + 64),
                   **(WIDTH | {"intermediate_size": intermediate}))
    return path


def run_at(ref: str, model: Path, a) -> int:
    """This script, run on the code of `ref`: its tree exported to a temporary directory and imported from there
    (the local peers too: they run `python -m sfchat` in it)."""
    with tempfile.TemporaryDirectory(prefix="sfchat-ref-") as tree:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        (Path(tree) / "REVISION").write_text(subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", ref],
                                                            check=True, capture_output=True, text=True).stdout)
        args = [sys.executable, __file__, "--tokens", str(a.tokens), "--layers", str(a.layers), "--intermediate",
                str(a.intermediate), "--peers", str(a.peers), "--repeats", str(a.repeats), "--models", str(a.models),
                "--code", tree]
        return subprocess.run(args, cwd=tree, env=dict(os.environ, PYTHONPATH=tree)).returncode


def describe(code: Path) -> str:
    if (code / "REVISION").exists():
        return (code / "REVISION").read_text().strip()
    rev = subprocess.run(["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(code), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return rev.stdout.strip() + (" with changes" if dirty else "")


async def measure(model: Path, peers: int, a) -> float:
    """Median seconds of --repeats prefills through the host and `peers` local peers (after one short one)."""
    import trio

    from peers.host.host import Host
    from peers.base.options import HostOptions
    from sfchat.local import LocalPeers

    share = 1.0 + 1.2 * a.layers / (peers + 1)  # GB each: an even split of the layers, room for the context
    host = Host(HostOptions(str(model), offer_gb=share, max_context=a.tokens + 64), say=lambda *_: None)
    ids = [(i * 7919) % 250 + 3 for i in range(a.tokens)]
    times = []
    async with trio.open_nursery() as nursery:
        await nursery.start(host.serve)
        with LocalPeers(peers, host.address, host.token, model=str(model), extra=["--offer-gb", str(share)]) as lp:
            if peers:
                await host.wait_members(peers, timeout=300)
                await host.replan()
            spans = [str(host.shard.span)] + [str(m.span) for m in host.ring]
            print(f"  {'host alone' if not peers else f'host + {peers} peers'}: layers {', '.join(spans)}", flush=True)
            for i in range(a.repeats + 1):
                n = 64 if i == 0 else a.tokens  # the first, short, warms the allocators up
                rs = host.new_session(f"prefill-{i}")
                t0 = time.perf_counter()
                _, timing = await host.forward(rs, ids[:n], [])
                seconds = time.perf_counter() - t0
                await host.drop(rs)
                if i:
                    times.append(seconds)
                    print(f"    {seconds:7.2f} s  (host {timing['host_ms'] / 1e3:.2f} s, members "
                          f"{timing['peers_ms'] / 1e3:.2f} s, network {timing['network_ms'] / 1e3:.2f} s)", flush=True)
            lp.check()
            await host.close()
        nursery.cancel_scope.cancel()
    return statistics.median(times)


if __name__ == "__main__":
    main()
