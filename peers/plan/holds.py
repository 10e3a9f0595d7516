"""Members that keep breaking are held out for a while, as Petals' client bans a failing server.

A member lost (killed, silent past the heartbeat limit), or the link into it broken, twice within WINDOW_S is given
no layers for HOLD_S; each hold after that within RESET_S of the last lasts twice as long, up to 32x HOLD_S. Every
fault costs the conversations a re-plan and a replay: a member that flaps would cost them again and again. A
held member stays in the roster (a spare) and is planned in again when its hold ends, or at once where the rest of
the ring cannot hold the model without it. Members are known by name: a process started again on the same machine
is the same member. Pure: free of trio and torch.
"""
from __future__ import annotations

import os

WINDOW_S = 60.0  # two faults this close hold a member out
HOLD_S = 15.0  # the first hold
DOUBLINGS = 5  # the longest hold: HOLD_S x 2^5
RESET_S = 600.0  # a member clean this long after its last hold starts again at the first


def first_hold() -> float:
    """HOLD_S, or SFCHAT_HOLD_S (0: no member is ever held out). The soak shortens it: its faults come every few
    seconds by design, and members held out for minutes would leave it faulting a ring of the host alone."""
    return float(os.environ.get("SFCHAT_HOLD_S") or HOLD_S)


class Holds:
    def __init__(self):
        self.faults: dict[str, list[float]] = {}  # by member key: its recent faults' times
        self.until: dict[str, float] = {}  # by member key: when its hold ends
        self.length: dict[str, float] = {}  # by member key: how long its next hold lasts

    def fault(self, key: str, now: float) -> float:
        """A fault of member `key` at `now`: the seconds it is held out from now, 0 for none."""
        times = [t for t in self.faults.get(key, []) if now - t < WINDOW_S] + [now]
        self.faults[key] = times
        first = first_hold()
        if len(times) < 2 or self.held(key, now) or first <= 0:
            return 0.0
        if now - self.until.get(key, -RESET_S) >= RESET_S:
            self.length[key] = first
        hold = self.length[key]
        self.until[key] = now + hold
        self.length[key] = min(2 * hold, first * 2**DOUBLINGS)
        self.faults[key] = []  # its faults count afresh after the hold
        return hold

    def held(self, key: str, now: float) -> bool:
        return self.left(key, now) > 0

    def left(self, key: str, now: float) -> float:
        """Seconds until member `key`'s hold ends (0: not held)."""
        return max(self.until.get(key, 0.0) - now, 0.0)
