"""A plain install works on its own: scripts/wheel_check builds the wheel from this tree, installs it alone in a
fresh venv, and answers a prompt there with the draft shipped in the wheel (the real SmolLM2)."""
import os
import subprocess
import sys

import pytest

from helpers import ROOT


@pytest.mark.slow
def test_the_wheel_installed_alone_answers_with_its_shipped_draft(smollm2):
    p = subprocess.run(["bash", str(ROOT / "scripts" / "wheel_check")], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PY": sys.executable})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "wheel_check: the installed wheel drafts with its shipped draft and has its stylesheet" in p.stdout
