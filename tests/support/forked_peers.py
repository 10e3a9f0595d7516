"""LocalPeers whose peer processes are forked from tests/support/peer_zygote.py instead of started afresh: each is still
its own process running `sfchat join`'s main on real sockets, the same command LocalPeers gives it, but it starts
with torch and transformers already imported (a fresh interpreter spends ~4 s of CPU on that, which on two cores
was most of what running_ring's rings cost). A ForkedPeer answers as the subprocess.Popen it stands for."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from sfchat.local import PARENT_PID, LocalPeers, child_env

ZYGOTE = Path(__file__).with_name("peer_zygote.py")
# read by torch, transformers or huggingface_hub when imported: a forked child keeps the zygote's values, so a
# peer asked for with other values of these starts as a fresh interpreter (test_hub's HF_ENDPOINT, say)
IMPORT_TIME_ENV = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "OMP_", "MKL_", "KMP_", "TORCH_",
                   "PYTORCH_", "CUDA_", "PYTHON")


def import_time_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_ENV)}


class Zygote:
    def __init__(self):
        self.lock = threading.Lock()
        self.env = child_env()
        self.proc = subprocess.Popen([sys.executable, "-P", str(ZYGOTE)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=self.env)

    def ask(self, req: dict) -> dict:
        with self.lock:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the peer zygote exited with {self.proc.wait()}")
        return json.loads(line)


_zygote: Zygote | None = None


def zygote() -> Zygote:
    """This process's zygote (one per pytest-xdist worker), started on first use."""
    global _zygote
    if _zygote is None or _zygote.proc.poll() is not None:
        _zygote = Zygote()
    return _zygote


class ForkedPeer:
    """The subprocess.Popen calls that LocalPeers, sfchat.local.stop and the tests make, for a forked peer."""

    def __init__(self, args: list[str], pid: int, zyg: Zygote):
        self.args, self.pid, self._zygote, self.returncode = args, pid, zyg, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.ask({"poll": self.pid})["code"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:  # it ended since (the zygote reaps its children as they end), as Popen allows
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkedLocalPeers(LocalPeers):
    def start(self, cmd: list[str], log: Path, env: dict[str, str], mode: str = "w") -> ForkedPeer:
        """(mode: a restarted peer's log is written afresh here, not appended to)"""
        zyg = zygote()
        if import_time_env(env) != import_time_env(zyg.env):
            return super().start(cmd, log, env)  # a fork would keep the zygote's values
        argv = cmd[cmd.index("sfchat") + 1:]  # what follows `python -P -m sfchat`
        pid = zyg.ask({"start": argv, "env": env | {PARENT_PID: str(zyg.proc.pid)}, "cwd": os.getcwd(),
                       "log": str(log)})["pid"]
        return ForkedPeer(cmd, pid, zyg)
