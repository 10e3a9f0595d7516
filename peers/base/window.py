"""How long a group that tends to arrive together is waited for: the host's batcher gathers conversations'
rounds into one pass (peers/host/batcher.py), drafting together gathers their draft steps into one forward
(peers/speculation/drafting/together.py). Each waits twice the spread of the last arrivals it saw, within
[floor, cap]: long enough for those who come a little late, never long for one who does not come."""
from __future__ import annotations


class GatherWindow:
    def __init__(self, floor: float, cap: float, start: float):
        self.floor, self.cap, self.s = floor, cap, start

    def learn(self, spread: float) -> None:
        """The last group arrived `spread` seconds apart: wait twice that next time."""
        self.s = min(max(self.floor, 2 * spread), self.cap)
