"""`sfchat serve` (headless: host the ring and serve) and the endpoint beside `sfchat host --serve`."""
from __future__ import annotations

import signal
from contextlib import asynccontextmanager

import trio

from sfchat.options import RingOptions, ServeOptions
from sfchat.runtime import Ring, build_host, compute_line, new_drafter, open_ring, say

from peers import parse_addr

from sfchat.invite import for_host, listening

from .auth import check_exposure
from .conversations import Conversations
from .server import serve_api


def check_serve(opts: ServeOptions) -> None:
    """Before anything loads: a bad address, an open port beyond loopback without a key."""
    check_exposure(parse_addr(opts.listen)[0], opts.api_key, opts.insecure_no_key)


async def start(nursery: trio.Nursery, ring: Ring, drafter, opts: RingOptions,
                on_change=None, reserved: int = 0) -> tuple[Conversations, str]:
    """Serve the endpoint opts.serve in `nursery` (the host's own loop); returns its conversations and URL.
    reserved: rows of every member's arena another conversation keeps (the TUI's chat)."""
    serve = opts.serve
    conv = Conversations(ring.host, ring.tokenizer, ring.eos, drafter, limit=serve.max_conversations,
                         on_change=on_change, answer=opts.answer, prefix_cache=opts.prefix_cache, reserved=reserved)
    binds = await nursery.start(lambda task_status: serve_api(
        conv, serve.listen, api_key=serve.api_key, insecure_no_key=serve.insecure_no_key,
        keepalive_s=serve.keep_alive_s, strict_model=serve.strict_model, task_status=task_status))
    opts.answer.pin(conv.policy)  # --k, --tree-nodes, --no-trees, --in-flight pin the rounds here too
    conv.url = binds[0]
    return conv, binds[0]


@asynccontextmanager
async def serving_beside(ring: Ring, drafter, opts: RingOptions, *, say=say, on_change=None):
    """`host --serve`: the endpoint runs in the host's loop for as long as the block does (nothing without
    --serve); yields its conversations, or None."""
    async with trio.open_nursery() as nursery:
        conv = None
        if opts.serve is not None:
            conv, url = await start(nursery, ring, drafter, opts, on_change, reserved=1)  # (the TUI's chat)
            say(f"serving {ring.host.source.name} at {url}/v1 (up to {conv.limit} conversations at once)")
        try:
            yield conv
        finally:
            nursery.cancel_scope.cancel()


async def serve_command(opts: RingOptions) -> int:
    """Until Ctrl+C or SIGTERM. Either is read here, as a message: raised as KeyboardInterrupt it would land in
    whatever task ran (a stream's send, say), where the web server takes it for that request's error and serves
    on. Once the endpoint is up, a signal ends it and the ring closes as usual; before, it ends the start-up."""
    host = build_host(opts)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as outer:
            stop = outer.cancel_scope

            async def on_signal() -> None:
                async for sig in signals:
                    say(f"sfchat serve: {signal.Signals(sig).name}; stopping")
                    stop.cancel()
                    return

            outer.start_soon(on_signal)
            async with open_ring(opts, host=host, stay=True) as ring:
                drafter = await new_drafter(opts.answer.draft, ring)
                async with trio.open_nursery() as nursery:
                    conv, url = await start(nursery, ring, drafter, opts)
                    stop = nursery.cancel_scope
                    say(f"sfchat serving {host.source.name} at {url}/v1 (up to {conv.limit} conversations at "
                        f"once; {host.device}, {compute_line(host)})")
                    say(f"ring on {listening(host)}. On each other machine run:\n"
                        f"  {for_host(host, opts.advertise, listen_flag='--ring-listen')}")
            outer.cancel_scope.cancel()  # (the signal's watcher)
    return 0
