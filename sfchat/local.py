"""`--local-peers N`: real peer processes on this machine, joined over loopback, that die with their parent."""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

from peers.locations import cache_dir

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass  # not Linux: the parent still terminates its children on exit


def local_name(i: int) -> str:
    """local-a, local-b, …: letters, so no name reads like a member number (the host numbers members)."""
    return "local-" + (chr(ord("a") + i) if i < 26 else str(i + 1))


def stop(procs: list[subprocess.Popen], timeout: float = 5) -> None:
    """SIGTERM each child process (all at once, so their exits overlap), SIGKILL any still there after timeout."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class LocalPeers:
    def __init__(self, n: int, host_addr: str, token: str, *, model: str | None = None, dtype: str = "auto",
                 quant: str = "none", extra: list[str] | None = None):
        self.procs: list[subprocess.Popen] = []
        logs = cache_dir() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.log_paths: list[Path] = []
        env = os.environ | {"SFCHAT_TOKEN": token}  # not in argv: any user of the machine reads that in `ps`
        for i in range(n):
            cmd = [sys.executable, "-m", "sfchat", "join", host_addr, "--headless",
                   "--name", local_name(i), "--listen", "127.0.0.1:0", "--dtype", dtype, "--quant", quant]
            if model:
                cmd += ["--model", model]
            cmd += extra or []
            path = logs / f"local-peer-{os.getpid()}-{i + 1}.log"
            self.log_paths.append(path)
            with open(path, "w") as log:
                self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                   env=env, preexec_fn=_die_with_parent))

    def check(self) -> None:
        for i, p in enumerate(self.procs):
            if p.poll() is not None:
                tail = self.log_paths[i].read_text().strip().splitlines()[-1:] or ["(no output)"]
                raise RuntimeError(f"a local peer (pid {p.pid}) exited with {p.returncode}: {tail[0]}")

    def close(self) -> None:
        stop(self.procs)
        for path in self.log_paths:
            path.unlink(missing_ok=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
