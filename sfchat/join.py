"""`sfchat join`'s life: join, serve, and when the host goes away (closes the ring, dies, restarts) wait for it
and join again, the same process with the same name and its layers kept, trying again with backoff (capped at
BACKOFF_MAX_S) until Ctrl+C or --give-up-after. A host that is only silent (paused, busy) keeps its link and is
simply waited for (peers/member/peer.py). What waiting cannot fix ends it at once: a wrong token or certificate, or
another model or revision. A member that cannot take its span (the model cannot be fetched or loaded here, or does
not fit) exits non-zero with its line; with --stay it joins again after --retry-s."""
from __future__ import annotations

import math
import signal
import threading

import trio

from peers import dial
from peers import AuthError
from peers import ChannelClosed
from peers import CannotServe
from peers import Peer

from .options import JoinOptions

BACKOFF_MAX_S = 30.0


class GaveUp(RuntimeError):
    """The host did not come back within --give-up-after."""


async def join_ring(opts: JoinOptions, say, on_change=None) -> str:
    """Serve the ring; returns why it ended (a host that closed it, with --give-up-after 0). Errors before the first
    join (refused, wrong token), and what waiting cannot fix, raise."""
    failed, repeats = "", 0  # why the last join could not serve, and how often in a row: said once, "still" once
    peer = Peer(opts.peer, on_change=on_change)  # one for the process's life: its layers stay loaded
    ever = False  # it has joined once: from then on a host that goes away is waited for
    while True:
        try:
            await run_until_ctrl_c(peer)
            gone = "the host closed the ring"
        except CannotServe as e:
            if not opts.stay or e.other_model:
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
            if not (ever or peer.joined) or isinstance(e, AuthError) or type(e).__name__ in ("PinError", "NotTLS"):
                raise
            gone = f"lost the host ({e})"
        ever = ever or peer.joined
        if opts.give_up_after == 0:
            return gone
        if peer.joined:  # (a try that did not get through while waiting is not news)
            until = "" if opts.give_up_after is None else f", for up to {opts.give_up_after:.0f} s"
            say(f"{gone}; waiting for it to come back{until}, layers kept (Ctrl+C ends)")
        await wait_for(opts.peer.address, opts.give_up_after)


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


async def wait_for(address: str, give_up_after: float | None = None) -> None:
    """Until something accepts connections at the host's address again: a try each second for the first 10 s (a
    host restarting is back in seconds), then backoff doubling up to BACKOFF_MAX_S; GaveUp past give_up_after."""
    start, delay = trio.current_time(), 1.0
    limit = math.inf if give_up_after is None else give_up_after
    while True:
        waited = trio.current_time() - start
        if waited >= limit:
            raise GaveUp(f"the host did not come back within {give_up_after:.0f} s (--give-up-after)")
        await trio.sleep(min(delay, max(limit - waited, 0.0)))
        if trio.current_time() - start > 10:
            delay = min(delay * 2, BACKOFF_MAX_S)
        try:
            stream = await dial(address)
        except OSError:
            continue
        await stream.aclose()
        return
