"""`sfchat bench`: every mode at every RTT ends up in the table and the JSON, with its ceiling worked out."""
from __future__ import annotations

import json
import os

from helpers import sfchat
from sfchat.bench import Row, Sample


def test_ceiling_arithmetic():
    # 2 runs, 4 rounds of 3 tokens each, 20 ms of compute per round, behind an 80 ms RTT
    row = Row("ring-spec", 80.0, [Sample(tokens=12, seconds=0.5, rounds=4, drafted=12, accepted=8, compute_ms=80)] * 2)
    d = row.to_dict()
    assert d["tokens_per_round"] == 3.0 and d["acceptance"] == round(8 / 12, 4)
    assert d["ceiling_tokens_per_second"] == 30.0  # 3 tokens per (80 + 20) ms
    assert d["tokens_per_second"] == 24.0 and d["fraction_of_ceiling"] == 0.8
    # one process: the RTT does not apply to its rounds
    assert Row("transformers", 80.0, [Sample(10, 0.5, 10, compute_ms=400)]).to_dict()["ceiling_tokens_per_second"] == 25.0


def test_bench_runs_every_mode(tiny_llama, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the quick brown fox jumps over the lazy dog, the quick brown fox\n")
    out = tmp_path / "bench.json"
    p = sfchat("bench", "--model", str(tiny_llama), "--rtt-ms", "10", "--max-new-tokens", "6", "--runs", "1",
               "--prompts", str(prompts), "--json", str(out), timeout=120)
    assert "RTT 10 ms" in p.stdout and "ring-spec" in p.stdout and "transformers-assisted" in p.stdout
    doc = json.loads(out.read_text())
    assert doc["machine"]["cores"] == os.cpu_count() and doc["config"]["draft"] == "ngram"
    got = {(r["mode"], r["rtt_ms"]) for r in doc["rows"]}
    assert got == {("transformers", 0), ("transformers-assisted", 0), ("ring", 10), ("ring-spec", 10)}
    for r in doc["rows"]:
        assert r["tokens_per_second"] > 0 and r["ceiling_tokens_per_second"] > 0
        # one token a round without a draft; a speculative round commits its accepted drafts and one more
        assert r["tokens_per_round"] == 1.0 if r["mode"] in ("transformers", "ring") else r["tokens_per_round"] >= 1
        assert {"acceptance", "fraction_of_ceiling", "compute_ms_per_round"} <= r.keys()
