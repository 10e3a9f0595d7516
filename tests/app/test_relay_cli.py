"""The commands: `sfchat relay`, `sfchat host --relay` and `sfchat join <the invite>`, as separate processes."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from transformers import AutoTokenizer

from helpers import ROOT, child_env, reference_ids, wait_for_line


class Proc:
    """A `sfchat` process whose stderr goes to a log in `logs`."""

    def __init__(self, logs: Path, *args: str, stdin=None):
        self.log = logs / f"{args[0]}.log"
        with open(self.log, "w") as err:
            self.p = subprocess.Popen([sys.executable, "-m", "sfchat", *args], cwd=ROOT, text=True, stdin=stdin,
                                      stdout=subprocess.PIPE, stderr=err, env=child_env())

    def wait_for(self, pattern: str, timeout: float = 60) -> re.Match:
        return wait_for_line(self.log, pattern, self.p, timeout)

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
        self.p.wait(timeout=10)


def test_host_and_join_through_relay_commands(tiny_llama, tmp_path):
    model, prompt = str(tiny_llama), "the quick brown fox"
    relay = Proc(tmp_path, "relay", "--listen", "127.0.0.1:0")
    procs = [relay]
    try:
        raddr = relay.p.stdout.readline().split()[3]
        host = Proc(tmp_path, "host", "--headless", "--relay", raddr, "--listen", "127.0.0.1:0", "--model", model,
                    "--draft", "none", "--temperature", "0", "--max-new-tokens", "12", stdin=subprocess.PIPE)
        procs.append(host)
        invite = host.wait_for(r"sfchat join (relay://\S+) --token (\S+)")
        peer = Proc(tmp_path, "join", invite[1], "--token", invite[2], "--model", model, "--headless", "--name", "far")
        procs.append(peer)
        peer.wait_for(r"loaded layers")
        host.p.stdin.write(prompt + "\n")
        host.p.stdin.flush()
        answer = host.p.stdout.readline().rstrip("\n")
        want = AutoTokenizer.from_pretrained(tiny_llama).decode(reference_ids(tiny_llama, prompt, 12),
                                                                skip_special_tokens=True)
        assert answer == want
        host.p.stdin.close()
        assert host.p.wait(timeout=30) == 0
        relay.wait_for(r"registered \w+/far-")  # the peer is reachable through the relay as well
        relay.wait_for(r"-> \w+/far-\w+ connected")  # and the host's first hop went through it
        assert relay.log.read_text().count(raddr) == 1  # its start-up said once: the hosts' hint beside stdout's line
    finally:
        for p in reversed(procs):
            p.stop()
