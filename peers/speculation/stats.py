"""Per-round and running statistics of generation, as plain dicts for --json and the TUI."""
from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass, field


@dataclass(slots=True)
class RoundStats:
    k: int
    drafted: int
    accepted: int
    committed: int
    draft_ms: float  # drafting on the critical path
    hidden_draft_ms: float  # drafting done while the previous round was on the wire, and used
    network_ms: float
    host_ms: float
    peers: list  # [[name, ms], ...]
    verify_ms: float
    round_ms: float
    tree: bool = False  # the drafts were a tree (`drafted` nodes, branching where the draft was unsure) ...
    depth: int = 0  # ... this many levels deep (a chain: its length); `accepted` is how deep the accepted path went
    batch: int = 1  # conversations whose rounds went round in the same pass (peers/host/batcher.py)
    in_flight: int = 1  # this conversation's rounds on the ring when it was sent, itself included (peers/speculation/in_flight.py)
    cancelled: bool = False  # everything it carried was dead before its reply came (a verdict contradicted it)
    caught: bool = False  # a rejection in an earlier round landed on this round's hedge: no round trip was lost

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RunningStats:
    started: float = field(default_factory=time.perf_counter)
    tokens: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    trees: int = 0  # rounds whose drafts were a tree
    in_flight: int = 0  # the rounds' in_flight, summed
    cancelled: int = 0  # rounds cancelled
    caught: int = 0  # rejections a hedge caught
    draft_ms: float = 0.0
    hidden_draft_ms: float = 0.0
    peak_tps: float = 0.0
    window: deque = field(default_factory=lambda: deque(maxlen=8))  # (tokens, seconds) of recent rounds
    history: list = field(default_factory=list)  # tokens/s after each round, for the sparkline

    def add(self, r: RoundStats) -> None:
        self.tokens += r.committed
        self.rounds += 1
        self.drafted += r.drafted
        self.accepted += r.accepted
        self.trees += r.tree
        self.in_flight += r.in_flight
        self.cancelled += r.cancelled
        self.caught += r.caught
        self.draft_ms += r.draft_ms
        self.hidden_draft_ms += r.hidden_draft_ms
        self.window.append((r.committed, r.round_ms / 1e3))
        now = self.now_tps
        if len(self.window) >= 2 or self.rounds == 1:
            self.peak_tps = max(self.peak_tps, now)
        self.history.append(now)

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    @property
    def now_tps(self) -> float:
        t = sum(s for _, s in self.window)
        return sum(n for n, _ in self.window) / t if t else 0.0

    @property
    def avg_tps(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def summary(self) -> dict:
        total_draft = self.draft_ms + self.hidden_draft_ms
        return {"tokens": self.tokens, "seconds": round(self.seconds, 4), "tokens_per_second": round(self.avg_tps, 3),
                "tokens_per_second_now": round(self.now_tps, 3), "tokens_per_second_peak": round(self.peak_tps, 3),
                "rounds": self.rounds,  # (a round a verdict cancelled commits nothing: not one of tokens/round's)
                "tokens_per_round": round(self.tokens / (self.rounds - self.cancelled), 3)
                if self.rounds > self.cancelled else 0.0,
                "drafted": self.drafted, "accepted": self.accepted, "tree_rounds": self.trees,
                "rounds_in_flight": round(self.in_flight / self.rounds, 3) if self.rounds else 0.0,
                "cancelled_share": round(self.cancelled / self.rounds, 4) if self.rounds else 0.0,
                "hedges_caught": self.caught,
                "acceptance": round(self.accepted / self.drafted, 4) if self.drafted else None,
                "draft_ms": round(self.draft_ms, 2), "draft_hidden_fraction":
                    round(self.hidden_draft_ms / total_draft, 4) if total_draft else None}
