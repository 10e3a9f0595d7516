"""This process's own stalls: times its event loop did not run (work that blocked it, or the process itself stopped
by SIGSTOP, a laptop lid, a VM hiccup). Silence heard across such a stall is ours, not the other side's: a link or a
member judged by it gets a fresh grace period (peers/links/channel.py, peers/plan/roster.py).

A trio task ticks every TICK_S; a tick that comes more than STALL_S late marks a stall. A watcher thread looks
at the loop while it is blocked and takes the loop thread's stack, so the one warning a stall gets names what ran
(a process that was stopped as a whole stops its threads too: that warning says so instead).
"""
from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections import deque

import trio

log = logging.getLogger("sfchat.loop")
TICK_S = 0.1
STALL_S = 1.0  # a loop blocked past this is a stall: warned about, and silence across it excused


class Stalls:
    def __init__(self):
        self.beat = time.monotonic()  # the loop's last tick
        self.ended: deque[tuple[float, float]] = deque(maxlen=64)  # (when a stall ended, how long it was)
        self.blocker = ""  # what the loop thread ran, as the watcher saw it during the stall under way
        self.loop_thread = 0
        self._thread_beat = time.monotonic()  # the watcher's own: late too, and the whole process was stopped
        self._running = False

    def within(self, seconds: float, now: float | None = None) -> bool:
        """Whether this process stalled in the last `seconds` (or is stalled now)."""
        if not self._running:
            return False
        now = time.monotonic() if now is None else now
        return now - self.beat > STALL_S or any(now - end < seconds for end, _ in self.ended)

    async def run(self) -> None:
        """The loop's ticks (start it once per process; a second call returns at once)."""
        if self._running:
            return
        self._running, self.loop_thread = True, threading.get_ident()
        self.beat = time.monotonic()
        threading.Thread(target=self._watch, name="sfchat-stalls", daemon=True).start()
        try:
            while True:
                await trio.sleep(TICK_S)
                now = time.monotonic()
                if (late := now - self.beat - TICK_S) > STALL_S:
                    self.ended.append((now, late))
                    if self.blocker:
                        log.warning("the event loop was blocked for %.1f s by %s", late, self.blocker)
                    else:
                        log.warning("this process did not run for %.1f s (stopped, or starved of CPU): its "
                                    "peers' silence over that time is not counted against them", late)
                self.beat, self.blocker = now, ""
        finally:
            self._running = False

    def _watch(self) -> None:
        while self._running:
            time.sleep(TICK_S)
            now = time.monotonic()
            whole = now - self._thread_beat > STALL_S  # this thread did not run either: the process was stopped
            self._thread_beat = now
            if not whole and not self.blocker and now - self.beat > STALL_S:
                frame = sys._current_frames().get(self.loop_thread)
                if frame is not None and not _idle(frame):
                    self.blocker = where(frame)


def _idle(frame) -> bool:
    """The loop thread waiting for I/O (it was not blocked: it has not been scheduled yet after a stop)."""
    return frame.f_code.co_name in ("get_events", "poll", "select", "epoll_wait") or "_io_epoll" in frame.f_code.co_filename


def where(frame) -> str:
    """The innermost frames of the loop thread's stack, sfchat's own first: what it was running."""
    stack = traceback.extract_stack(frame)
    ours = [f for f in stack if "/peers/" in f.filename or "/sfchat/" in f.filename]
    shown = (ours or stack)[-3:]
    return " <- ".join(f"{f.name} ({f.filename.rsplit('/', 2)[-2]}/{f.filename.rsplit('/', 1)[-1]}:{f.lineno})"
                       for f in reversed(shown)) + (f", in {stack[-1].name}" if ours and stack[-1] is not ours[-1]
                                                   else "")


STALLS = Stalls()  # one per process: its event loop's
