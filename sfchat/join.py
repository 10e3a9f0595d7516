"""`sfchat join`'s life: join, serve until the host closes the ring, then exit (0) or, with --stay, wait to
join again when the host is back. A member that cannot take its span (the model cannot be fetched or loaded here,
or does not fit) exits non-zero with its line; with --stay it joins again after a while."""
from __future__ import annotations

import signal
import threading

import trio

from peers import dial
from peers import ChannelClosed
from peers import CannotServe
from peers import Peer

from .options import JoinOptions


async def join_ring(opts: JoinOptions, say, on_change=None) -> str:
    """Serve the ring; returns why it ended (a normal end). Errors before joining (refused, wrong token) raise."""
    failed, repeats = "", 0  # why the last join could not serve, and how often in a row: said once, "still" once
    while True:
        peer = Peer(opts.peer, on_change=on_change)
        try:
            await run_until_ctrl_c(peer)
            gone = "the host closed the ring"
        except CannotServe as e:
            if not opts.stay:
                raise
            repeats = repeats + 1 if str(e) == failed else 0
            if repeats == 0:
                say(f"cannot serve: {e}; joining again in {opts.retry_s:.0f} s (--stay; Ctrl+C ends)")
            elif repeats == 1:
                say(f"still cannot serve; joining again every {opts.retry_s:.0f} s (--stay; Ctrl+C ends)")
            failed = str(e)
            await trio.sleep(opts.retry_s)
            continue
        except (ChannelClosed, OSError, BaseExceptionGroup) as e:
            if isinstance(e, BaseExceptionGroup):  # a broken link seen inside a nursery (a pong on a closed socket)
                if e.split((ChannelClosed, OSError))[1] is not None:
                    raise
                while isinstance(e, BaseExceptionGroup):
                    e = e.exceptions[0]
            if not (opts.stay and peer.st.state != "connecting"):
                raise
            gone = f"lost the host ({e})"
        if not opts.stay:
            return gone
        say(f"{gone}; waiting for it to come back (--stay; Ctrl+C ends)")
        await wait_for(opts.peer.address)


async def run_until_ctrl_c(peer: Peer) -> None:
    """peer.run(); Ctrl+C (SIGINT) first tells the host this member leaves, then ends it as Ctrl+C does."""
    if threading.current_thread() is not threading.main_thread():  # (the peer screen: Textual has the keys)
        return await peer.run()
    async def on_ctrl_c() -> None:
        async for _ in signals:
            await peer.leave()
            raise KeyboardInterrupt

    with trio.open_signal_receiver(signal.SIGINT) as signals:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(on_ctrl_c)
                await peer.run()
                nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:  # what peer.run raised, as join_ring expects it (CannotServe, say)
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise


async def wait_for(address: str, every_s: float = 2.0) -> None:
    """Until something accepts connections at the host's address again."""
    while True:
        await trio.sleep(every_s)
        try:
            stream = await dial(address)
        except OSError:
            continue
        await stream.aclose()
        return
