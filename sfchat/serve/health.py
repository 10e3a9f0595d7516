"""What /health says: `ok` only when the ring can answer now; else `replanning` or `degraded`, with the reason and
since when, and a 503 for a load balancer's readiness probe.

The ring cannot answer while a re-plan runs, while its plan has a hole (a member lost, loading, failed: the
planner's own check before every pass), or while a member of the ring has been silent for a few heartbeats (paused,
or its machine asleep: answers stall until it speaks again or is declared lost, which for a member whose pongs were
slow can take a minute).
"""
from __future__ import annotations

import time
from datetime import datetime, timezone

SILENT_BEATS = 3  # heartbeats without a pong before a member's silence is news


class Health:
    def __init__(self, host):
        self.host = host
        self.state, self.since = ("ok", ""), time.time()

    def judge(self) -> tuple[str, str]:
        """(status, reason) now."""
        host = self.host
        if host.replanning:
            return "replanning", "the ring is re-planning (a member joined, left or was lost)"
        if problem := host.planner.problem():
            return "degraded", problem
        now = time.monotonic()
        for m in host.ring:  # silent past three heartbeats and its slowest recent pong (its loss may take a minute)
            if (silent := now - m.last_seen) > SILENT_BEATS * host.roster.heartbeat_s + max(m.rtts, default=0.0):
                return "degraded", f"member {m.id} ({m.name}) has been silent for {silent:.1f} s"
        return "ok", ""

    def now(self) -> dict:
        state = self.judge()
        if state != self.state:
            self.state, self.since = state, time.time()
        status, reason = state
        since = datetime.fromtimestamp(self.since, timezone.utc).isoformat(timespec="seconds")
        return {"status": status, "reason": reason, "since": since}
