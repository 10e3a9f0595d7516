"""`sfchat serve` (headless: host the ring and serve) and the endpoint beside `sfchat host --serve`."""
from __future__ import annotations

import trio

from sfchat.runtime import Ring, build_host, drafter_for, open_ring, say

from peers.channel import parse_addr

from .auth import check_exposure
from .conversations import Conversations
from .server import serve_api


def check_args(args) -> None:
    """Before anything loads: a bad address, an open port without a key, a limit below one."""
    check_exposure(parse_addr(args.serve)[0], args.api_key, args.insecure_no_key)
    if args.max_conversations is not None and args.max_conversations < 1:
        raise ValueError("--max-conversations must be at least 1")
    if not args.keep_alive_s > 0:
        raise ValueError("--keep-alive-s must be above 0")


async def start(nursery: trio.Nursery, ring: Ring, drafter, args, on_change=None) -> tuple[Conversations, str]:
    """Serve the endpoint on args.serve in `nursery` (the host's own loop); returns its conversations and URL."""
    conv = Conversations(ring.host, ring.tokenizer, ring.eos, drafter,
                         limit=getattr(args, "max_conversations", None), on_change=on_change)
    binds = await nursery.start(lambda task_status: serve_api(
        conv, args.serve, api_key=getattr(args, "api_key", None),
        insecure_no_key=getattr(args, "insecure_no_key", False), keepalive_s=args.keep_alive_s,
        task_status=task_status))
    return conv, binds[0]


async def serve_command(args) -> int:
    host = build_host(args)
    async with open_ring(args, wait_peers=args.wait_peers, host=host) as ring:
        drafter = drafter_for(args, ring)
        async with trio.open_nursery() as nursery:
            conv, url = await start(nursery, ring, drafter, args)
            say(f"sfchat serving {host.model_dir.name} at {url}/v1 (up to {conv.limit} conversations at once)")
            say(f"ring on {host.address}. On each other machine run:\n  {host.invite()}")
    return 0
