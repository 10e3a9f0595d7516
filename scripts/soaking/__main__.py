"""python -m scripts.soaking (scripts/soak): bring up the ring, load, fault and fuzz it at once for a while, then
print one table (and JSON) of what happened; exit 1 when anything was wrong or lost, a process crashed, or the
host's RSS grew past the bound."""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from peers.links.auth import new_token

from . import http_fuzz, ring_fuzz
from .faults import Faults
from .load import client_loop
from .reference import references
from .relay import RelayThread
from .ring import Ring, rss_mb
from .tally import Tally

KEY = "soak-key"
GRACE_S = 300  # after the deadline, requests under way may finish (and be retried) for this long


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="scripts/soak", description=__doc__.split(":", 1)[1].strip())
    ap.add_argument("--minutes", type=float, default=30.0, help="how long the load, faults and fuzzing run")
    ap.add_argument("--model", default="smollm2-135m", help="a model directory, or the embedded default")
    ap.add_argument("--peers", type=int, default=2, help="members besides the host")
    ap.add_argument("--clients", type=int, default=8, help="clients streaming at once")
    ap.add_argument("--fault-every", type=float, default=60.0, metavar="S",
                    help="seconds between kills (a partition a quarter period after each; between the first two "
                         "and every fourth period after, a stop of 2 to 20 s)")
    ap.add_argument("--idle-s", type=float, default=20.0, metavar="S",
                    help="one idle spell of this long (past the ring's idle timeouts, shortened to half of it)")
    ap.add_argument("--max-tokens", type=int, default=12, help="each answer's length: short, so requests turn over")
    ap.add_argument("--frames-per-s", type=float, default=14.0, help="bad ring frames' rate, about")
    ap.add_argument("--http-per-s", type=float, default=1.0, help="bad HTTP requests' rate, about")
    ap.add_argument("--hang-s", type=float, default=240.0, help="a request silent this long is lost")
    ap.add_argument("--rss-bound-mb", type=float, default=256.0,
                    help="how much the host's RSS may grow from the start (after a first answer to each prompt) "
                         "to the end")
    ap.add_argument("--workdir", type=Path, help="logs and soak.json (default: a new temporary folder)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("serve_args", nargs="*", help="after --: more flags for `sfchat serve` (--draft ngram, say; -v: the "
                                                       "host's debug log)")
    return ap.parse_args(argv)


T0 = time.monotonic()


def say(line: str) -> None:
    print(f"soak [{time.monotonic() - T0:6.1f} s]: {line}", file=sys.stderr, flush=True)


def count_tracebacks(ring: Ring) -> int:
    return sum(p.log.read_text(errors="replace").count("Traceback (most recent call last)") for p in ring.procs
               if p.log.exists())


async def soak(args, ring: Ring, relay: RelayThread, refs: dict, hidden: int, model: str, tally: Tally) -> None:
    faults = Faults(ring, relay, tally, args.fault_every, args.idle_s, seed=args.seed)
    # a first answer to each prompt, before anything else: exactness on a calm ring, and the RSS baseline
    await asyncio.gather(*(client_loop(i, ring.url, KEY, model, {p: refs[p]}, args.max_tokens, 0, args.hang_s,
                                       tally, faults, once=True) for i, p in enumerate(refs)))
    tally.rss_mb["start"], tally.spares_mb["start"] = rss_mb(ring.host.pid), ring.spares_mb()
    say(f"{len(refs)} first answers {'exact' if tally.exact == len(refs) else 'NOT all exact'}; host RSS "
        f"{tally.rss_mb['start']:.0f} MiB; {args.minutes:g} minutes of load, faults and fuzzing begin")
    start = time.monotonic()
    deadline = start + args.minutes * 60

    async def middle():
        await asyncio.sleep(args.minutes * 30)
        tally.rss_mb["middle"], tally.spares_mb["middle"] = rss_mb(ring.host.pid), ring.spares_mb()

    async def progress():
        while time.monotonic() < deadline:
            await asyncio.sleep(60)
            say(f"{(time.monotonic() - start) / 60:.0f} min: {tally.exact} exact, {tally.wrong} wrong, "
                f"{tally.lost} lost, {sum(tally.errors.values())} errors, {tally.killed} killed, "
                f"{tally.stopped} stopped, {tally.cut} links cut, {tally.frames} frames, {tally.http_bad} bad HTTP")

    async with asyncio.timeout(args.minutes * 60 + GRACE_S):
        async with asyncio.TaskGroup() as tg:
            timers = [tg.create_task(middle()), tg.create_task(progress())]
            watch = tg.create_task(faults.watch(deadline + GRACE_S))
            tg.create_task(faults.run(deadline))
            tg.create_task(ring_fuzz.run(ring, hidden, deadline, args.frames_per_s, tally, faults, seed=args.seed + 1))
            tg.create_task(http_fuzz.run(ring.http_port, KEY, model, deadline, args.http_per_s, tally,
                                         seed=args.seed + 2))
            clients = [tg.create_task(client_loop(i, ring.url, KEY, model, refs, args.max_tokens, deadline,
                                                  args.hang_s, tally, faults)) for i in range(args.clients)]
            await asyncio.gather(*clients)
            say("the load is done")
            for t in (watch, *timers):
                t.cancel()
    await asyncio.to_thread(ring.wait_ready, 60)
    tally.rss_mb["end"], tally.spares_mb["end"] = rss_mb(ring.host.pid), ring.spares_mb()


def main(argv: list[str]) -> int:
    args = parse(argv)
    from peers.models.source import resolve

    model_dir = resolve(args.model, say=lambda *a: None)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    say(f"references of {model_dir.name} with plain transformers; logs in {workdir}")
    with ThreadPoolExecutor(1) as pool:  # while the ring comes up
        refs = pool.submit(references, str(model_dir), args.max_tokens)
        hidden = json.loads((model_dir / "config.json").read_text())["hidden_size"]
        tally = Tally()
        relay = RelayThread()
        ring = Ring(str(model_dir), args.peers, workdir, key=KEY, token=new_token(), clients=args.clients,
                    serve_args=args.serve_args, relay=relay.start(), link_idle_s=args.idle_s / 2)
        try:
            ring.start()
            say("the ring is up")
            refs = refs.result()
        except BaseException as e:
            ring.close()
            relay.close()
            if isinstance(e, RuntimeError):  # a ring that did not come up: its logs say why
                say(str(e))
                return 1
            raise
    try:
        model = ring.health()["model"]
        asyncio.run(soak(args, ring, relay, refs, hidden, model, tally))
    except (RuntimeError, TimeoutError, ExceptionGroup) as e:
        tally.note(f"the soak stopped early: {type(e).__name__}: {e}")
        tally.lost += 1  # whatever was under way; the notes say why
    finally:
        say("closing the ring")
        ring.close()
        relay.close()
        say("closed")
        tally.tracebacks = count_tracebacks(ring)
        tally.exit_codes = {p.name: p.popen.returncode for p in ring.procs if p.popen is not None}
        if tally.exit_codes.get("host") not in (0, 130, None):  # 130: stopped by its Ctrl+C, as asked
            tally.crashes += 1
            tally.note(f"the host exited with {tally.exit_codes['host']} when asked to stop (Ctrl+C)")
    tally.config = {"argv": argv, "model": model_dir.name, "minutes": args.minutes, "peers": args.peers,
                    "clients": args.clients, "fault_every_s": args.fault_every, "idle_s": args.idle_s,
                    "max_tokens": args.max_tokens,
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    summary = tally.summary(args.rss_bound_mb)
    (workdir / "soak.json").write_text(tally.json(args.rss_bound_mb))
    print(tally.table(args.rss_bound_mb))
    for line in tally.notes:
        print("  " + line)
    print(f"JSON: {workdir / 'soak.json'}")
    print("FAILED: " + "; ".join(summary["failures"]) if summary["failures"] else "PASSED")
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
