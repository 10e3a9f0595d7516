"""What the soak counts, the table and JSON it ends with, and its verdict."""
from __future__ import annotations

import bisect
import json
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass, field


@dataclass
class Tally:
    # requests
    sent: int = 0  # attempts, retries included
    exact: int = 0
    wrong: int = 0
    errors: Counter = field(default_factory=Counter)  # a proper OpenAI error, by HTTP status (then retried)
    lost: int = 0  # silence, a hang, a connection dropped without an error, a stream cut short
    latency_s: list = field(default_factory=list)  # (seconds, a fault overlapped it) per answered request
    # members
    killed: int = 0
    stopped: int = 0
    cut: int = 0  # links cut at the relay (closed or blackholed)
    replans: int = 0
    idled: int = 0  # idle spells past the ring's timeouts
    faults: list = field(default_factory=list)  # (kind, when, wall clock) of each fault
    token_times: list = field(default_factory=list)  # when each piece of streamed text arrived
    # bad input
    frames: int = 0
    frames_authenticated: int = 0
    connections: int = 0
    ring_held: int = 0  # bad ring connections not hung up on in time
    http_bad: int = 0
    http_improper: int = 0  # a complete bad request not answered with an OpenAI error
    disconnects: int = 0  # clients gone mid-stream
    # processes
    crashes: int = 0
    tracebacks: int = 0  # in the logs of the host and its members
    rss_mb: dict = field(default_factory=dict)  # host RSS: start, middle, end
    spares_mb: dict = field(default_factory=dict)  # of which its spare layers, kept by design (a bounded cache)
    exit_codes: dict = field(default_factory=dict)  # each process's, once stopped at the end
    config: dict = field(default_factory=dict)  # how the soak was run
    notes: list = field(default_factory=list)  # one line per problem, for the report

    def note(self, line: str) -> None:
        if len(self.notes) < 200:
            self.notes.append(line)

    def percentiles(self, faulted: bool) -> dict:
        xs = sorted(s for s, f in self.latency_s if f == faulted)
        if not xs:
            return {"n": 0, "p50_s": None, "p99_s": None}
        return {"n": len(xs), "p50_s": round(statistics.median(xs), 3),
                "p99_s": round(xs[min(len(xs) - 1, int(0.99 * len(xs)))], 3)}

    def fault_to_token(self) -> dict:
        """Per kind of fault: seconds from it to the next piece of text any client received (p50, p99, max)."""
        times, out, slow = sorted(self.token_times), {}, {}
        for kind, at, wall in self.faults:
            i = bisect.bisect_right(times, at)
            if i < len(times):
                out.setdefault(kind, []).append(times[i] - at)
                when = time.strftime("%H:%M:%S", time.gmtime(wall))
                slow.setdefault(kind, []).append((round(times[i] - at, 2), when))
        return {k: {"n": len(xs), "p50_s": round(statistics.median(xs), 2),
                    "p99_s": round(sorted(xs)[min(len(xs) - 1, int(0.99 * len(xs)))], 2), "max_s": round(max(xs), 2),
                    "slowest_utc": sorted(slow[k], reverse=True)[:3]}  # to find them in the logs
                for k, xs in sorted(out.items())}

    def summary(self, rss_bound_mb: float) -> dict:
        d = asdict(self)
        d["errors"] = {str(k): v for k, v in sorted(self.errors.items(), key=str)}
        d["fault_to_token"] = self.fault_to_token()
        del d["latency_s"], d["token_times"], d["faults"]
        d["latency"] = {"without_faults": self.percentiles(False), "with_faults": self.percentiles(True)}
        d["rss_bound_mb"] = rss_bound_mb
        d["failures"] = self.failures(rss_bound_mb)
        return d

    def failures(self, rss_bound_mb: float) -> list[str]:
        out = []
        if self.wrong:
            out.append(f"{self.wrong} answers wrong")
        if self.lost:
            out.append(f"{self.lost} requests lost")
        if self.crashes:
            out.append(f"{self.crashes} process crashes")
        if self.tracebacks:
            out.append(f"{self.tracebacks} tracebacks in the logs")
        if self.ring_held:
            out.append(f"{self.ring_held} bad ring connections held open")
        if self.http_improper:
            out.append(f"{self.http_improper} bad HTTP requests not answered with an OpenAI error")
        if not self.exact:
            out.append("no request answered")
        grew = self.rss_mb.get("end", 0) - self.rss_mb.get("start", 0) - (
            self.spares_mb.get("end", 0) - self.spares_mb.get("start", 0))
        if grew > rss_bound_mb:
            out.append(f"host RSS grew {grew:.0f} MiB (bound {rss_bound_mb:.0f} MiB)")
        return out

    def table(self, rss_bound_mb: float) -> str:
        s = self.summary(rss_bound_mb)
        errs = ", ".join(f"{k}: {v}" for k, v in s["errors"].items()) or "none"
        lat = s["latency"]

        def p(x):
            return f"p50 {x['p50_s']} s, p99 {x['p99_s']} s ({x['n']})" if x["n"] else "none"

        rss, spares = self.rss_mb, self.spares_mb

        def at(when):
            return f"{rss.get(when, 0):.0f} MiB ({spares.get(when, 0):.0f} of spare layers)"
        rows = [
            ("requests", f"{self.sent} sent, {self.exact} answered exact, {self.wrong} answered wrong, "
                         f"errors ({errs}), {self.lost} lost"),
            ("members", f"{self.killed} killed, {self.stopped} stopped, {self.cut} links cut, {self.replans} re-plans, "
                        f"{self.idled} idle spells"),
            ("bad input", f"{self.frames} frames ({self.frames_authenticated} from an authenticated member), "
                          f"{self.connections} connections ({self.ring_held} held open), {self.http_bad} HTTP requests "
                          f"({self.http_improper} answered improperly), {self.disconnects} clients gone mid-stream"),
            ("processes", f"{self.crashes} crashes, {self.tracebacks} tracebacks in the logs"),
            ("host", f"RSS at start {at('start')}, middle {at('middle')}, end {at('end')} (bound: +{rss_bound_mb:.0f} "
                     "MiB besides the spare layers)"),
            ("latency", f"without faults {p(lat['without_faults'])}; with faults {p(lat['with_faults'])}"),
            ("fault -> next token", "; ".join(f"{k}: p50 {v['p50_s']} s, p99 {v['p99_s']} s, max {v['max_s']} s "
                                              f"({v['n']})" for k, v in s["fault_to_token"].items()) or "none"),
        ]
        lines = ["| what | counted |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows]
        return "\n".join(lines)

    def json(self, rss_bound_mb: float) -> str:
        return json.dumps(self.summary(rss_bound_mb), indent=1)
