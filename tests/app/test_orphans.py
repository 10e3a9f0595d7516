"""Ctrl+C or a closed terminal stops every process the app started: no orphan peers."""
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import child_env, children


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP, signal.SIGKILL])
def test_no_orphans(sig, tiny_llama, tmp_path):
    log = open(tmp_path / "host.log", "w+")  # the host's own account, shown if the ring is not what we expect
    p = subprocess.Popen([sys.executable, "-m", "sfchat", "ask", "hello world " * 20, "--model", str(tiny_llama),
                          "--local-peers", "2", "--max-new-tokens", "100000", "--draft", "none"],
                         stdout=subprocess.PIPE, stderr=log, env=child_env())
    try:
        p.stdout.read(1)  # the answer is streaming: the ring is up
        kids = children(p.pid)
        assert len(kids) == 2, f"{len(kids)} local peers; the host said: {(tmp_path / 'host.log').read_text()}"
        p.send_signal(sig)
        p.wait(timeout=20)
        deadline = time.time() + 15
        while any(alive(k) for k in kids) and time.time() < deadline:
            time.sleep(0.1)
        assert not any(alive(k) for k in kids)
    finally:
        p.kill()
        log.close()
