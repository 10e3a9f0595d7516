"""`sfchat serve` (headless: host the ring and serve) and the endpoint beside `sfchat host --serve`."""
from __future__ import annotations

from contextlib import asynccontextmanager

import trio

from sfchat.runtime import Ring, build_host, drafter_for, invite_for, open_ring, say

from peers.channel import parse_addr

from .auth import check_exposure
from .conversations import Conversations
from .server import serve_api


def check_args(args) -> None:
    """Before anything loads: a bad address, an open port beyond loopback without a key."""
    check_exposure(parse_addr(args.serve)[0], args.api_key, args.insecure_no_key)


async def start(nursery: trio.Nursery, ring: Ring, drafter, args, on_change=None) -> tuple[Conversations, str]:
    """Serve the endpoint on args.serve in `nursery` (the host's own loop); returns its conversations and URL."""
    conv = Conversations(ring.host, ring.tokenizer, ring.eos, drafter,
                         limit=getattr(args, "max_conversations", None), on_change=on_change)
    binds = await nursery.start(lambda task_status: serve_api(
        conv, args.serve, api_key=getattr(args, "api_key", None),
        insecure_no_key=getattr(args, "insecure_no_key", False), keepalive_s=args.keep_alive_s,
        task_status=task_status))
    conv.policy.pinned = getattr(args, "k", None)  # --k pins the draft length here too
    conv.url = binds[0]
    return conv, binds[0]


@asynccontextmanager
async def serving_beside(ring: Ring, drafter, args, *, say=say, on_change=None):
    """`host --serve`: the endpoint runs in the host's loop for as long as the block does (nothing without
    --serve); yields its conversations, or None."""
    async with trio.open_nursery() as nursery:
        conv = None
        if getattr(args, "serve", None):
            conv, url = await start(nursery, ring, drafter, args, on_change)
            say(f"serving {ring.host.model_dir.name} at {url}/v1 (up to {conv.limit} conversations at once)")
        try:
            yield conv
        finally:
            nursery.cancel_scope.cancel()


async def serve_command(args) -> int:
    host = build_host(args)
    async with open_ring(args, wait_peers=args.wait_peers, host=host) as ring:
        drafter = drafter_for(args, ring)
        async with trio.open_nursery() as nursery:
            conv, url = await start(nursery, ring, drafter, args)
            say(f"sfchat serving {host.model_dir.name} at {url}/v1 (up to {conv.limit} conversations at once)")
            say(f"ring on {host.address}. On each other machine run:\n  {invite_for(args, host)}")
    return 0
