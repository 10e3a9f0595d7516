"""Data links that know they are alive. A data link carries passes one way only, and may be idle for hours; a
link cut without a FIN (a cable, a blackholing middlebox, a machine asleep) looks exactly like an idle one. So its
writer sends a keepalive frame whenever it has sent nothing for KEEPALIVE_S, and its reader, which then hears
something at least that often, takes silent_s() (2.5 s) without a byte as the link's death, and says so (the
member at that end tells the host, which re-wires the ring): a frame that went into such a link is not waited for
until the pass timeout. The silence is counted between bytes, not per frame: a large frame on a slow link is
progress.

Silence alone cannot tell a dead link from a stopped or starved process at its other end, hence the 2.5 s. The
host can: it hears every member. So a reader also says when its link has been silent for QUIET_S (three
keepalives missed), and the host takes that for the link's death at once where the member writing into it still
answers its pings (peers/plan/planner.py): both ends running, nothing coming through."""
from __future__ import annotations

import os

import trio

from peers.base.stalls import STALLS
from peers.links.channel import Channel

KEEPALIVE_S = 0.5
KEEPALIVE = {"t": "ka"}  # read and dropped by the link's reader; never passed on
QUIET_S = 1.5


def silent_s() -> float:
    """How long a data link may be silent before its reader declares it dead (SFCHAT_LINK_SILENT_S: tests)."""
    return float(os.environ.get("SFCHAT_LINK_SILENT_S") or 2.5)


def watched(ch: Channel) -> Channel:
    """A data link's reading end: silent for silent_s(), it is dead (ChannelIdle)."""
    ch.read_timeout, ch.between_bytes = silent_s(), True
    return ch


async def keep_alive(ch: Channel, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A data link's writing end: a keepalive first of all (its reader knows a ring member's link by it), then
    something at least every KEEPALIVE_S, until the link is gone (its other users say why). Started with
    nursery.start: the first keepalive is on its way before any frame."""
    try:
        await ch.send(KEEPALIVE)
    except Exception:
        return
    finally:
        task_status.started()
    while not ch.closed:
        wait = ch.last_sent + KEEPALIVE_S - trio.current_time()
        if wait > 0:
            await trio.sleep(wait)
            continue
        try:
            await ch.send(KEEPALIVE)
        except Exception:  # (a closed link: whoever else uses it finds out and says so)
            return


async def say_quiet(ch: Channel, say) -> None:
    """A ring link's reading end: `await say(seconds)` once it has waited QUIET_S without a byte, and again every
    KEEPALIVE_S while that lasts; never for silence across this process's own stall."""
    while not ch.closed:
        await trio.sleep(0.1)
        s = ch.silent_for()
        if s >= QUIET_S and ch.kept_alive and not STALLS.within(s):
            await say(s)
            await trio.sleep(KEEPALIVE_S)
