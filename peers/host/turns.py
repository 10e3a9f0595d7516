"""Conversations take turns on the ring, so that one long prompt does not stall every other answer.

A long pass (a prompt's prefill, a replay) goes round in chunks. While other conversations are answering, its
chunks are short (SHARED_CHUNK positions), and before each chunk after its first every other answering
conversation gets one pass of its own: a chunk, a round of each of the others, the next chunk. Alone, a pass goes
in chunks as large as a frame allows, without waiting.
"""
from __future__ import annotations

from contextlib import contextmanager

import trio

SHARED_CHUNK = 64  # positions of a chunk while others answer: a round of theirs never waits long behind one
WAIT_AT_MOST_S = 10.0  # a conversation that does not come to its pass (a slow drafter, say) does not hold up others


class Turns:
    def __init__(self):
        self.passes: dict[str, int] = {}  # answering conversation -> passes (and chunks) it has had so far
        self.yielding: set[str] = set()  # conversations waiting between two chunks for the others
        self._changed = trio.Event()
        self.waited_out = 0  # waits that ran their whole WAIT_AT_MOST_S (a conversation that never came: a stall)

    @contextmanager
    def answering(self, sid: str):
        """Around one answer of conversation sid: the others wait for its passes from now on."""
        self.passes[sid] = 0
        try:
            yield
        finally:
            del self.passes[sid]
            self._notify()

    def others(self, sid: str) -> bool:
        return any(k != sid for k in self.passes)

    def went(self, sid: str) -> None:
        """Conversation sid has had a pass (or a chunk of one)."""
        if sid in self.passes:
            self.passes[sid] += 1
            self._notify()

    async def let_others_go(self, sid: str, stop=lambda: False) -> None:
        """Before sid's next chunk: wait until each other answering conversation has had one more pass, has ended,
        or is itself waiting between chunks; `stop()` ends the wait early (a re-plan wants the ring)."""
        owed = {k: n + 1 for k, n in self.passes.items() if k != sid}
        if not owed:
            return
        self.yielding.add(sid)
        self._notify()
        try:
            with trio.move_on_after(WAIT_AT_MOST_S) as scope:
                while not stop() and any(self.passes.get(k, due) < due and k not in self.yielding
                                         for k, due in owed.items()):
                    with trio.move_on_after(0.1):  # stop() is polled: a re-plan does not notify us
                        await self._changed.wait()
            self.waited_out += scope.cancelled_caught
        finally:
            self.yielding.discard(sid)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
