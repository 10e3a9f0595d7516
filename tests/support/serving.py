"""A real `sfchat serve` process for the endpoint's tests: started, waited for, its local peers found, stopped."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

from helpers import ROOT, child_env, children, wait_for_line

KEY = "test-key"


class Server:
    def __init__(self, model: Path, log: Path, *args: str, peers: int = 0, timeout: float = 180,
                 env: dict[str, str] | None = None):
        """env: the server's environment (default: the tests', helpers.child_env)."""
        cmd = [sys.executable, "-m", "sfchat", "serve", "--model", str(model), "--http-listen", "127.0.0.1:0",
               "--ring-listen", "127.0.0.1:0", "--local-peers", str(peers), "--api-key", KEY, *args]
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env or child_env(), cwd=ROOT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)  # (a terminal's group)
        try:
            m = wait_for_line(log, r"serving \S+ at (http://\S+)/v1", self.proc, timeout)
        except AssertionError:
            self.close()
            raise
        self.url, self.model = m.group(1), model.name
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)

    def health(self) -> dict:
        return self.http.get("/health").json()  # (a 503 while the ring cannot answer: its body says why)

    def peer_pids(self) -> list[int]:
        return children(self.proc.pid)

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


def client(server: Server) -> openai.OpenAI:
    """The real openai client on a server, retrying nothing (a test sees every failure)."""
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]
