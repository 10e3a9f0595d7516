"""The drafting package: apart from training, and its shipped draft found as package data."""
import subprocess
import sys
from pathlib import Path

import peers.speculation.drafting
from helpers import ROOT, child_env
from peers.speculation.drafting.feature_net import is_distilled, read_meta
from peers.speculation.drafting.shipped import drafts_dir


def test_drafting_imports_nothing_from_training():
    code = "import sys, peers.speculation.drafting; print(sorted(m for m in sys.modules if m.startswith('peers.distill')))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
                       env=child_env())
    assert p.stdout.strip() == "[]"


def test_the_shipped_draft_is_package_data(monkeypatch):
    monkeypatch.delenv("SFCHAT_DRAFTS_DIR", raising=False)
    d = drafts_dir() / "smollm2-135m"
    assert d == Path(peers.speculation.drafting.__file__).parent / "shipped" / "smollm2-135m"
    assert is_distilled(d) and read_meta(d)["target"] == "smollm2-135m"
    monkeypatch.setenv("SFCHAT_DRAFTS_DIR", "/elsewhere")
    assert drafts_dir() == Path("/elsewhere")
