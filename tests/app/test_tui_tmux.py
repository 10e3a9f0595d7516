"""A person's session in a real terminal: scripts/tmux_check.sh on the real SmolLM2 with two local peers."""
import os
import shutil
import subprocess
import sys

import pytest

from helpers import ROOT


@pytest.mark.slow
@pytest.mark.tmux
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_tmux_session(smollm2):
    p = subprocess.run(["bash", str(ROOT / "scripts" / "tmux_check.sh")], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHON": sys.executable})  # the app runs where the test does
    print(p.stdout)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]
    assert "OK: tmux check passed" in p.stdout
