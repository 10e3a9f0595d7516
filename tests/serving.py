"""A real `sfchat serve` process for the endpoint's tests: started, waited for, its local peers found, stopped."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from helpers import ROOT

KEY = "test-key"


class Server:
    def __init__(self, model: Path, log: Path, *args: str, peers: int = 0, timeout: float = 180):
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        cmd = [sys.executable, "-m", "sfchat", "serve", "--model", str(model), "--listen", "127.0.0.1:0",
               "--ring-listen", "127.0.0.1:0", "--local-peers", str(peers), "--api-key", KEY, *args]
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                         stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not (m := re.search(r"serving \S+ at (http://\S+)/v1", log.read_text())):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise AssertionError(f"sfchat serve did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        self.url, self.model = m.group(1), model.name
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)

    def health(self) -> dict:
        return self.http.get("/health").json()

    def peer_pids(self) -> list[int]:
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(self.proc.pid)], capture_output=True, text=True)
        return [int(x) for x in out.stdout.split()]

    def wait_until(self, check, timeout: float = 30, what: str = "") -> dict:
        deadline = time.monotonic() + timeout
        while True:
            h = self.health()
            if check(h):
                return h
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} did not happen: {h}")
            time.sleep(0.2)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
