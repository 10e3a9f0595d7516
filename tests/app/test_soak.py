"""The soak's short form (scripts/soak, docs/reliability.md): the tiny random Llama on a ring of real processes,
loaded by the openai client while members are killed, stopped and cut off (their links closed or blackholed at
the relay), the ring idles past its timeouts, and every port is fuzzed, for a minute. Every answer exact, none
lost, no crash, the host's RSS bounded; and each kind of fault and bad input really happened. Faults come one at a
time (each once the ring is whole again after the one before), a kill every 12 s with a partition and a pause
between."""
from __future__ import annotations

import json
import subprocess
import sys

from helpers import ROOT, child_env


def test_a_minute_of_faults_bad_input_and_load(tiny_llama, tmp_path):
    p = subprocess.run([sys.executable, "-m", "scripts.soaking", "--minutes", "1", "--model", str(tiny_llama),
                        "--clients", "4", "--fault-every", "12", "--idle-s", "6", "--frames-per-s", "10",
                        "--http-per-s", "2",
                        "--workdir", str(tmp_path), "--", "--draft", "ngram"],
                       cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=560)
    assert p.returncode == 0, p.stdout[-5000:] + p.stderr[-3000:]
    s = json.loads((tmp_path / "soak.json").read_text())
    assert s["exact"] >= 20 and s["wrong"] == s["lost"] == s["crashes"] == 0, s
    assert s["killed"] >= 2 and s["stopped"] >= 1 and s["cut"] >= 1 and s["idled"] == 1, s  # the faults happened
    assert s["replans"] >= 3 and {"kill", "stop"} <= set(s["fault_to_token"]), s
    assert s["frames_authenticated"] >= 100 and s["frames"] - s["frames_authenticated"] >= 100, s
    assert s["http_bad"] >= 50 and s["disconnects"] >= 1, s
