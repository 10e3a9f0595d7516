"""The commands: `sfchat relay`, `sfchat host --relay` and `sfchat join <the invite>`, as separate processes."""
from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from transformers import AutoTokenizer

from helpers import reference_ids

ROOT = Path(__file__).resolve().parent.parent


class Proc:
    """A `sfchat` process whose stderr lines are collected as they come."""

    def __init__(self, *args: str, stdin=None):
        self.p = subprocess.Popen([sys.executable, "-m", "sfchat", *args], cwd=ROOT, text=True, stdin=stdin,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  env=dict(os.environ, PYTHONPATH=str(ROOT)))
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=lambda: [self.lines.put(ln) for ln in self.p.stderr], daemon=True).start()

    def wait_for(self, pattern: str, timeout: float = 60) -> re.Match:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                assert self.p.poll() is None, f"exited {self.p.returncode}:\n" + "".join(self.seen)
                continue
            self.seen.append(line)
            if m := re.search(pattern, line):
                return m
        raise AssertionError(f"no {pattern!r} within {timeout} s:\n" + "".join(self.seen))

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
        self.p.wait(timeout=10)


def test_host_and_join_through_relay_commands(tiny_llama):
    model, prompt = str(tiny_llama), "the quick brown fox"
    relay = Proc("relay", "--listen", "127.0.0.1:0")
    procs = [relay]
    try:
        raddr = relay.p.stdout.readline().split()[3]
        host = Proc("host", "--headless", "--relay", raddr, "--listen", "127.0.0.1:0", "--model", model,
                    "--draft", "none", "--temperature", "0", "--max-new-tokens", "12", stdin=subprocess.PIPE)
        procs.append(host)
        invite = host.wait_for(r"sfchat join (relay://\S+) --token (\S+)")
        peer = Proc("join", invite[1], "--token", invite[2], "--model", model, "--headless", "--name", "far")
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
    finally:
        for p in reversed(procs):
            p.stop()
