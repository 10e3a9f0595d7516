"""`sfchat bench --clients`: a row per RTT and number of concurrent clients, measured over the real endpoint."""
from __future__ import annotations

import json

from helpers import sfchat
from sfchat.bench_serve import checks, percentile


def test_percentiles_and_checks():
    assert percentile([5, 1, 4, 2, 3], 0.5) == 3 and percentile([5, 1, 4, 2, 3], 0.95) == 5
    rows = [{"clients": 1, "rtt_ms": 86.0, "aggregate_tokens_per_second": 10.0},
            {"clients": 4, "rtt_ms": 86.0, "aggregate_tokens_per_second": 27.0}]
    assert checks(rows) == ["at 86 ms: 4 clients reach 2.70x the aggregate tokens/s of 1"]


def test_bench_clients_rows(tiny_llama, tmp_path):
    out = tmp_path / "bench.json"
    p = sfchat("bench", "--model", str(tiny_llama), "--clients", "1,2", "--rtt-ms", "0", "--max-new-tokens", "6",
               "--runs", "1", "--draft", "ngram", "--json", str(out), timeout=180)
    assert "concurrent clients" in p.stdout and "2 clients reach" in p.stdout
    doc = json.loads(out.read_text())
    assert doc["rows"] == []  # --clients alone: only the serving rows
    assert [(r["clients"], r["rtt_ms"]) for r in doc["serving_rows"]] == [(1, 0.0), (2, 0.0)]
    for r in doc["serving_rows"]:
        assert r["aggregate_tokens_per_second"] > 0 and r["per_client_tokens_per_second"] > 0
        assert 0 < r["ttft_ms_p50"] <= r["ttft_ms_p95"]
        assert r["tokens_per_round"] >= 1.0  # every round commits at least the target's own token
        assert set(r["layers"]) == {"host", "local-a"}  # where the layers were while it was measured
