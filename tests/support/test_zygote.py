"""The peer zygote (tests/support/peer_zygote.py) forks only when a fork is safe, and a peer that needs other
import-time environment is started afresh (tests/support/forked_peers.py)."""
import subprocess
import sys
from pathlib import Path

from forked_peers import ForkedLocalPeers, ForkedPeer

HERE = Path(__file__).parent


def zygote_check(before_check: str) -> subprocess.CompletedProcess:
    code = f"import sys, threading, time; sys.path.insert(0, {str(HERE)!r}); import peer_zygote\n{before_check}\n" \
           "peer_zygote.fork_safe(); print('safe')"
    return subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120)


def test_the_zygote_refuses_to_fork_with_a_thread_running():
    assert zygote_check("").stdout.strip() == "safe"
    started = zygote_check("threading.Thread(target=time.sleep, args=(30,), daemon=True).start()")
    assert started.returncode != 0 and "started threads since its imports" in started.stderr


def test_a_peer_with_other_hub_settings_starts_afresh(tmp_path, monkeypatch):
    local = ForkedLocalPeers(0, "127.0.0.1:1", "token")
    cmd = [sys.executable, "-c", "import os; print(os.environ['HF_ENDPOINT'])"]
    env = dict(__import__("os").environ)
    proc = local.start(cmd, tmp_path / "a.log", env | {"HF_ENDPOINT": "http://127.0.0.1:9"})
    assert not isinstance(proc, ForkedPeer) and proc.wait(60) == 0
    assert (tmp_path / "a.log").read_text().strip() == "http://127.0.0.1:9"
