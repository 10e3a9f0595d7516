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
    assert "ring at RTT 10 ms" in p.stdout and "ring-spec" in p.stdout and "transformers-assisted" in p.stdout
    assert p.stdout.count("transformers-assisted") == 1  # one process, no network: its rows print once
    doc = json.loads(out.read_text())
    assert doc["machine"]["cores"] == os.cpu_count() and doc["config"]["draft"] == "ngram"
    # the header names the machine, and a legend under the tables says what every column counts
    m = doc["machine"]
    assert p.stdout.startswith(f"machine: {m['cpu']}, {m['cores']} cores, no GPU; torch {m['torch']}")
    assert "tokens/round" in p.stdout and "tok/round" not in p.stdout
    flat = " ".join(p.stdout.split())
    for column in ("tok/s new tokens / wall time of each answer, the prompt's reading (prefill) and the first token "
                   "included", "accept the share of drafted tokens", "compute ms/round measured compute per round",
                   "ceiling tok/s tokens/round / (RTT + compute ms/round)"):
        assert column in flat
    got = {(r["mode"], r["rtt_ms"]) for r in doc["rows"]}
    assert got == {("transformers", 0), ("transformers-assisted", 0), ("ring", 10), ("ring-spec", 10)}
    for r in doc["rows"]:
        assert r["tokens_per_second"] > 0 and r["ceiling_tokens_per_second"] > 0
        # one token a round without a draft; a speculative round commits its accepted drafts and one more
        assert r["tokens_per_round"] == 1.0 if r["mode"] in ("transformers", "ring") else r["tokens_per_round"] >= 1
        assert {"acceptance", "fraction_of_ceiling", "compute_ms_per_round"} <= r.keys()


def test_bench_help_explains_its_columns():
    out = " ".join(sfchat("bench", "--help").stdout.split())
    for column in ("tok/s", "tokens/round", "accept", "compute ms/round", "ceiling tok/s", "of ceiling"):
        assert f" {column} " in out.partition("columns:")[2], column
    assert "default: 1, where host, ask and serve start none" in out


def test_simulated_draft_keeps_each_token_with_its_probability():
    import pytest

    from peers.speculation.drafting.simulated import SimulatedDrafter, parse_simulated
    from peers.speculation.sampling import SamplingParams

    ref = list(range(10, 2010))
    d = SimulatedDrafter(0.6, 5000, [ref])
    got, _ = d.propose(ref[:10], 1990, SamplingParams())
    kept = [a == b for a, b in zip(got, ref[10:])]
    assert len(got) == 1990 and 0.55 < sum(kept) / len(kept) < 0.65  # seeded: the same every run
    assert d.propose(ref[:500], 3, SamplingParams())[0] == got[490:493]  # a position drafts the same token again
    assert d.propose([1, 2, 3], 3, SamplingParams())[0] == []  # a context it has no answer for
    assert d.name == "simulated acceptance 0.6" and parse_simulated("ngram") is None
    assert parse_simulated("simulated:0.6/0.8") == [(0.6, 0.0), (0.8, 0.0)]
    assert parse_simulated("simulated:0.6,0.8") == [(0.6, 0.8)] and not d.trees
    with pytest.raises(ValueError, match="temperature 0"):
        d.propose(ref[:10], 3, SamplingParams(temperature=0.7))
    with pytest.raises(ValueError, match="0..1"):
        parse_simulated("simulated:1.5")


def test_a_simulated_second_guess_is_right_with_its_probability_where_the_first_is_wrong():
    from peers.speculation.drafting.simulated import SimulatedDrafter
    from peers.speculation.sampling import SamplingParams

    ref = list(range(10, 2010))
    chain = SimulatedDrafter(0.6, 5000, [ref])
    d = SimulatedDrafter(0.6, 5000, [ref], second=0.5)
    assert d.trees and d.name == "simulated acceptance 0.6, second guess 0.5"
    first = second = 0
    for at in range(10, 1900, 7):
        t = d.propose_tree(ref[:at], 0.0, 3, 12, params=SamplingParams())
        roots = [i for i, p in enumerate(t.parents) if p == -1]
        assert [t.tokens[i] for i in roots][:1] == chain.propose(ref[:at], 1, SamplingParams())[0]  # the chain's
        assert t.sure[roots[0]] == 0.6 and abs(t.sure[roots[1]] - 0.2) < 1e-9
        first += t.tokens[roots[0]] == ref[at]
        second += t.tokens[roots[0]] != ref[at] and t.tokens[roots[1]] == ref[at]
    n = len(range(10, 1900, 7))
    assert 0.5 < first / n < 0.7 and 0.4 < second / (n - first) < 0.6
    assert len(t.tokens) == 12 and t == d.propose_tree(ref[:at], 0.0, 3, 12, params=SamplingParams())  # seeded


def test_bench_with_a_simulated_draft_and_a_failing_mode(tiny_llama, tmp_path):
    """tokens/round follows the simulated acceptance (all kept: K+1 a round; none: 1); a mode that fails (its draft
    does not exist) says why in its row, and the other rows still print; each row is a line of progress as it ends."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the quick brown fox jumps over the lazy dog\n")
    out = tmp_path / "bench.json"
    p = sfchat("bench", "--model", str(tiny_llama), "--rtt-ms", "0", "--max-new-tokens", "16", "--runs", "1",
               "--modes", "ring,ring-spec", "--k", "3", "--draft", "simulated:1/0", "--prompts", str(prompts),
               "--json", str(out), timeout=180)
    rows = {r.get("draft"): r for r in json.loads(out.read_text())["rows"]}
    kept, none = rows["simulated acceptance 1"], rows["simulated acceptance 0"]
    assert kept["mode"] == none["mode"] == "ring-spec" and "simulated acceptance 1" in p.stdout
    assert kept["acceptance"] == 1.0 and kept["tokens_per_round"] >= 3.0
    assert none["acceptance"] == 0.0 and none["tokens_per_round"] == 1.0
    assert set(kept["pass_ms"]["host"]) == {"T=4"}  # K+1 positions a pass
    p = sfchat("bench", "--model", str(tiny_llama), "--rtt-ms", "0", "--max-new-tokens", "4", "--runs", "1",
               "--modes", "ring,ring-spec", "--draft", str(tmp_path / "no-such-draft"), "--prompts", str(prompts),
               "--json", str(out), timeout=180)
    rows = {r["mode"]: r for r in json.loads(out.read_text())["rows"]}
    assert "error" in rows["ring-spec"] and "no-such-draft" in rows["ring-spec"]["error"]
    assert rows["ring"]["tokens_per_second"] > 0 and rows["ring"]["pass_ms"]["host"].keys() == {"T=1"}
    assert "ring-spec" in p.stdout and "failed" in p.stdout
    assert "bench: ring at 0 ms" in p.stderr and "bench: ring-spec" in p.stderr


def test_simulated_draft_is_for_bench_only(tiny_llama):
    p = sfchat("ask", "hi", "--model", str(tiny_llama), "--draft", "simulated:0.8", check=False, timeout=60)
    assert p.returncode == 2 and "for `sfchat bench` only" in p.stderr


def test_pin_puts_the_host_and_each_member_on_cores_of_their_own_and_spec_runs_with_and_without_rounds_in_flight(
        tiny_llama, tmp_path):
    """--pin: each process's cores, as the system reports them for the host and for each member's process while
    its ring is up; more processes than cores share them round-robin, said in one line. ring-spec runs once per
    --in-flight value (default auto,1) over the same prompts, each row saying which, and their ratio is printed."""
    import pytest

    from sfchat.pinning import split

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no sched_setaffinity here")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the quick brown fox jumps over the lazy dog\n")
    out = tmp_path / "bench.json"
    cores = sorted(os.sched_getaffinity(0))
    p = sfchat("bench", "--model", str(tiny_llama), "--local-peers", "2", "--pin", "--modes", "ring-spec",
               "--rtt-ms", "0", "--max-new-tokens", "8", "--runs", "1", "--draft", "simulated:0.8,0.6",
               "--prompts", str(prompts), "--json", str(out), timeout=240)
    doc = json.loads(out.read_text())
    want = dict(zip(("host", "local-a", "local-b"), split(3, cores)))
    assert doc["pin"] == want and doc["machine"]["torch_threads"] == len(want["host"])
    assert ("cores share them round-robin\n" in p.stderr) == (len(cores) < 3)  # one line
    assert "pinned: host on core" in p.stdout.splitlines()[1]
    assert [(r["mode"], r["in_flight"]) for r in doc["rows"]] == [("ring-spec", "auto"), ("ring-spec", 1)]
    assert doc["config"]["in_flight"] == ["auto", 1]
    for r in doc["rows"]:
        assert {m["name"]: m["cores"] for m in r["members"]} == want
        assert r["rounds_in_flight"] >= 1 and 0 <= r["cancelled_share"] <= 1 and r["hedges_caught"] >= 0
    flat = " ".join(p.stdout.split())
    assert "ring-spec, rounds in flight (auto)" in flat and "ring-spec, 1 in flight" in flat
    assert "in flight, 0% cancelled, 0 hedges caught: ring-spec, 1 in flight" in flat
    assert "with rounds in flight (auto) is" in flat and "x the same with 1 in flight" in flat


def test_a_member_started_with_cores_pins_itself_and_its_torch_threads():
    import subprocess
    import sys

    import pytest

    from sfchat.pinning import CORES_ENV

    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no sched_setaffinity here")
    core = sorted(os.sched_getaffinity(0))[-1]
    code = ("from sfchat.pinning import pin_from_env; pin_from_env(); import os, torch; "
            "print(sorted(os.sched_getaffinity(0)), torch.get_num_threads(), os.environ.get('%s'))" % CORES_ENV)
    p = subprocess.run([sys.executable, "-c", code], env=os.environ | {CORES_ENV: str(core)}, capture_output=True,
                       text=True, check=True)
    assert p.stdout.strip() == f"[{core}] 1 None"  # pinned, one torch thread, and its children not told again


def test_cores_split_in_blocks_or_round_robin():
    from sfchat.pinning import cores_text, split

    assert split(2, [0, 1]) == [[0], [1]]  # host on core 0, member 1 on core 1
    assert split(3, list(range(8))) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert split(3, [0, 1]) == [[0], [1], [0]]  # more processes than cores: round-robin
    assert (cores_text([3]), cores_text([0, 1, 2]), cores_text([0, 2])) == ("core 3", "cores 0-2", "cores 0,2")


def test_each_local_member_gets_its_own_flags():
    from sfchat.bench import member_args
    from sfchat.cli import parser

    args = parser().parse_args(["bench", "--local-peers", "3", "--member-threads", "4,,1", "--member-dtype",
                                ",bfloat16", "--member-offer-gb", "1.5"])
    assert member_args(args) == (["--threads", "4", "--offer-gb", "1.5"], ["--dtype", "bfloat16"], ["--threads", "1"])
    assert args.placement == "memory"  # bench's rows cross every member unless asked otherwise
