"""The ring under test as real processes: `sfchat serve` and N `sfchat join` members, each restartable with its
same command, watched for exits nobody asked for."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _ctrl_c() -> None:
    """(in each child, before it runs) Ctrl+C as a terminal delivers it: a soak started in the background of a
    shell without job control (`cmd &` in a script) inherits SIGINT ignored, and its ring would then never stop
    when asked."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@dataclass
class Proc:
    name: str
    cmd: list[str]
    env: dict
    log: Path
    popen: subprocess.Popen | None = None
    expected_exit: bool = False  # we killed it
    starts: int = 0
    exits: list = field(default_factory=list)

    def start(self) -> None:
        self.starts += 1
        with open(self.log, "a") as out:
            out.write(f"\n=== soak: start {self.starts} at {time.strftime('%H:%M:%S')}\n")
            out.flush()
            self.popen = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=self.env, cwd=ROOT, preexec_fn=_ctrl_c)
        self.expected_exit = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.popen.pid, sig)

    def kill(self) -> None:
        self.expected_exit = True
        self.signal(signal.SIGKILL)
        self.popen.wait(30)

    def interrupt(self) -> None:
        """Ctrl+C, as a person stops it (a stopped one is continued first)."""
        if self.alive():
            self.expected_exit = True
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGINT)

    def wait_end(self, timeout: float = 20) -> None:
        """Its exit, or, if it lingers, SIGABRT (faulthandler writes every thread's stack into its log: where it
        hung), then SIGKILL."""
        if self.popen is None:
            return
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGABRT)
            try:
                self.popen.wait(5)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


class Ring:
    """serve on 127.0.0.1 with its ring port and HTTP port, and `peers` members joined to it."""

    def __init__(self, model: str, peers: int, workdir: Path, *, key: str, token: str, clients: int,
                 serve_args: list[str], relay: str, link_idle_s: float):
        """relay: the members are reached through it (their data links can be cut there); link_idle_s: the
        ring's idle timeouts, shortened so that an idle spell of the soak outlasts them."""
        self.http_port, self.ring_port = free_port(), free_port()
        self.key, self.token, self.workdir = key, token, workdir
        # float32 and no quantization on the CPU: the answers are checked against plain transformers in float32;
        # members that break twice within a minute (every one does here) held out 1 s, doubling up to 32 s: held
        # out and planned in again all along, not a ring of the host alone
        env = dict(os.environ, PYTHONPATH=str(ROOT), SFCHAT_TOKEN=token, PYTHONUNBUFFERED="1",
                   SFCHAT_LINK_IDLE_S=str(link_idle_s), SFCHAT_CPU_DTYPE="float32", SFCHAT_CPU_QUANT="none",
                   SFCHAT_HOLD_S="1", PYTHONFAULTHANDLER="1")
        py = [sys.executable, "-m", "sfchat"]
        verbose = [a for a in serve_args if a in ("-v", "--verbose")]  # sfchat's own flag: before the command
        serve_args = [a for a in serve_args if a not in verbose]
        self.host = Proc("host", [*py, *verbose, "serve", "--model", model,
                                  "--http-listen", f"127.0.0.1:{self.http_port}",
                                  "--ring-listen", f"127.0.0.1:{self.ring_port}", "--token", token,
                                  "--api-key", key, "--wait-peers", str(peers), "--max-conversations", str(clients),
                                  "--keep-alive-s", "1", *serve_args], env, workdir / "host.log")
        self.members = [Proc(f"soak-{chr(97 + i)}", [*py, "join", f"127.0.0.1:{self.ring_port}", "--headless",
                                                        "--stay", "--retry-s", "2", "--name", f"soak-{chr(97 + i)}",
                                                        "--listen", "127.0.0.1:0", "--relay", relay,
                                                        "--model", model],
                             env, workdir / f"member-{i + 1}.log") for i in range(peers)]
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {key}"}, timeout=10)

    @property
    def procs(self) -> list[Proc]:
        return [self.host, *self.members]

    def start(self, timeout: float = 600) -> None:
        self.host.start()
        deadline = time.monotonic() + timeout
        while not listening(self.ring_port):  # members that dial too early give up
            if not self.host.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the host did not open its ring port: see {self.host.log}")
            time.sleep(0.2)
        for m in self.members:
            m.start()
        while not listening(self.http_port):  # serving: its endpoint is open (no log line is relied on)
            for p in self.procs:
                if not p.alive():
                    raise RuntimeError(f"{p.name} exited while the ring came up: see {p.log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the ring was not up in {timeout:.0f} s: see {self.host.log}")
            time.sleep(0.2)
        self.wait_ready(timeout)

    def health(self) -> dict:
        return self.http.get("/health").json()

    def spares_mb(self) -> float:
        """What the host's spare layers hold (peers/compute/spares.py): a cache within its bound, not a leak."""
        return self.health()["members"][0].get("spare_layers_bytes", 0) / 2**20

    def ready(self) -> bool:
        """Every member holds layers and is ready (or is held out for breaking twice within a minute: it is
        planned in again when its hold ends), and no re-plan is under way."""
        try:
            h = self.health()
        except (httpx.HTTPError, ValueError):
            return False
        members = h.get("members", [])[1:]
        ready = [m for m in members if m["state"] == "held" or
                 m["state"] == "ready" and m["layers"] not in ("", "none")]
        return h["status"] == "ok" and len(ready) == len(self.members)

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready():
                return True
            time.sleep(0.25)
        return False

    def ring_order(self) -> list[str]:
        """The relay endpoints of the members holding layers, in the ring's order (the first is the host's
        first hop)."""
        try:
            members = [m for m in self.health().get("members", [])[1:]
                       if m["state"] == "ready" and m["layers"] not in ("", "none") and m.get("address")]
        except (httpx.HTTPError, ValueError):
            return []
        members.sort(key=lambda m: int(m["layers"].split("-")[0]))
        return [m["address"].split("/", 3)[3] for m in members if m["address"].startswith("relay://")]

    def close(self) -> None:
        """Every process stopped at once (the host first), so that their exits overlap."""
        for p in self.procs:
            p.interrupt()
        for p in self.procs:
            p.wait_end()
        self.http.close()
