"""`sfchat relay`: the relay's arguments, and what it prints for the people running hosts."""
from __future__ import annotations

import logging
import sys

import trio

from peers import parse_addr
from peers import Relay
from peers import Shaping

from .invite import program, reach


def add_arguments(p) -> None:
    p.add_argument("--listen", default="0.0.0.0:7341", help="HOST:PORT to accept endpoints and dialers on")
    p.add_argument("--delay-ms", type=float, default=0.0, help="shaping: one-way delay added in each direction")
    p.add_argument("--jitter-ms", type=float, default=0.0, help="shaping: each chunk's delay varies by ± this (order kept)")
    p.add_argument("--tls", action="store_true", help="encrypt every connection to the relay; its address becomes "
                   "FINGERPRINT@HOST:PORT, which pins its certificate")
    p.add_argument("--rate-mbit", type=float, default=0.0, help="shaping: bandwidth cap per direction (0: none)")


def relay_hint(addr: str) -> str:
    """The host's command for this relay, with an address other machines reach (never a wildcard)."""
    pin, at, host_port = addr.rpartition("@")
    shown = reach(host_port, parse_addr(host_port)[1]).addresses[0]
    return f"{program()} host --relay {pin}{at}{shown}"


def run(args) -> int:
    """`sfchat relay`: serve until interrupted; the first stdout line names the address (scripts read it)."""
    if not args.verbose:
        logging.getLogger("sfchat.relay").setLevel(logging.INFO)  # the relay's log is its connection log
    relay = Relay(Shaping(args.delay_ms, args.jitter_ms, args.rate_mbit), tls=args.tls)

    async def main():
        async with trio.open_nursery() as nursery:
            addr = await nursery.start(relay.serve, args.listen)
            print(f"relay listening on {addr} ({relay.shaping})", flush=True)
            print(f"  hosts: {relay_hint(addr)}    joiners: the host's invite", file=sys.stderr, flush=True)

    trio.run(main)
    return 0
