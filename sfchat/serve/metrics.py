"""/metrics in Prometheus's text format (prometheus-client): what the endpoint counts as it answers (requests,
tokens, time to first token and per output token, tokens per round and acceptance), and the ring as it stands at
each scrape (passes and their rows, each member's state, layers and ms per layer, plans, faults by kind).

Each app has its own registry: several servers in one process (the tests) never share counters."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
PER_TOKEN = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2)
PER_ROUND = (1, 1.25, 1.5, 2, 2.5, 3, 4, 6, 8)


def layers(span: str) -> int:
    """How many layers a span's text ("11-20", "" for none) holds."""
    if "-" not in span:
        return 0
    a, b = span.split("-")
    return int(b) - int(a) + 1


class Ring:
    """The ring's figures, read from the host at each scrape."""

    def __init__(self, host, health):
        self.host, self.health = host, health

    def collect(self):
        host = self.host
        yield CounterMetricFamily("sfchat_passes", "Passes sent round the ring", value=host.batcher.batches)
        yield CounterMetricFamily("sfchat_pass_rows", "Conversations' rounds carried by those passes",
                                  value=host.batcher.rounds)
        yield CounterMetricFamily("sfchat_plans", "Plans of the ring made (the first and every re-plan)",
                                  value=host.epoch)
        faults = CounterMetricFamily("sfchat_faults", "Faults of the ring by kind", labels=["kind"])
        for kind, n in sorted(host.planner.faults.items()):
            faults.add_metric([kind], n)
        yield faults
        status = self.health.judge()[0]
        ready = GaugeMetricFamily("sfchat_ring_status", "1 for the ring's status now (ok, degraded, replanning)",
                                  labels=["status"])
        for s in ("ok", "degraded", "replanning"):
            ready.add_metric([s], float(s == status))
        yield ready
        names = ["member", "name"]
        state = GaugeMetricFamily("sfchat_member_state", "1 for each member's state", labels=names + ["state"])
        held = GaugeMetricFamily("sfchat_member_layers", "Layers each member holds", labels=names)
        speed = GaugeMetricFamily("sfchat_member_ms_per_layer", "Each member's measured ms per reference layer",
                                  labels=names)
        share = GaugeMetricFamily("sfchat_member_share", "Each member's share of the predicted time per token",
                                  labels=names)
        for m in host.members_info():
            who = [str(m["id"]), m["name"]]
            state.add_metric(who + [m["state"]], 1.0)
            held.add_metric(who, layers(m["layers"]))
            if m.get("ms_per_layer") is not None:
                speed.add_metric(who, m["ms_per_layer"])
            share.add_metric(who, m.get("share") or 0.0)
        yield from (state, held, speed, share)


class Metrics:
    def __init__(self, host, health):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("sfchat_requests", "HTTP requests by route and status", ["route", "status"],
                                registry=r)
        self.prompt_tokens = Counter("sfchat_prompt_tokens", "Prompt tokens of the answers", registry=r)
        self.completion_tokens = Counter("sfchat_completion_tokens", "Tokens generated", registry=r)
        self.first_token = Histogram("sfchat_time_to_first_token_seconds",
                                     "From a request's arrival to its first token", buckets=SECONDS, registry=r)
        self.per_token = Histogram("sfchat_time_per_output_token_seconds",
                                   "An answer's time per token after its first", buckets=PER_TOKEN, registry=r)
        self.per_round = Histogram("sfchat_tokens_per_round", "An answer's tokens per round of the ring",
                                   buckets=PER_ROUND, registry=r)
        self.rounds = Counter("sfchat_rounds", "Rounds of the answers (each a trip round the ring)", registry=r)
        self.drafted = Counter("sfchat_drafted_tokens", "Draft tokens sent for checking", registry=r)
        self.accepted = Counter("sfchat_accepted_tokens", "Draft tokens the model accepted", registry=r)
        r.register(Ring(host, health))

    def answered(self, job, outcome, first_token: float | None, end: float) -> None:
        """One answer's figures (times from time.monotonic())."""
        self.prompt_tokens.inc(len(job.prompt))
        self.completion_tokens.inc(outcome.completion_tokens)
        if first_token is not None:
            self.first_token.observe(first_token - job.arrived)
            if outcome.completion_tokens > 1:
                self.per_token.observe((end - first_token) / (outcome.completion_tokens - 1))
        s = outcome.stats
        if s.get("rounds"):
            self.rounds.inc(s["rounds"])
            self.per_round.observe(s["tokens_per_round"])
        self.drafted.inc(s.get("drafted") or 0)
        self.accepted.inc(s.get("accepted") or 0)

    def text(self) -> bytes:
        return generate_latest(self.registry)


class Counting:
    """ASGI middleware: each request counted by its route (a route served, else "other") and status."""

    def __init__(self, app, metrics: Metrics, routes: tuple[str, ...]):
        self.app, self.metrics, self.routes = app, metrics, routes

    def route(self, path: str) -> str:
        if path.startswith("/v1/models/"):
            return "/v1/models/{model}"
        return path if path in self.routes else "other"

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = [0]

        async def sent(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sent)
        finally:
            self.metrics.requests.labels(self.route(scope["path"]), str(status[0] or "none")).inc()
