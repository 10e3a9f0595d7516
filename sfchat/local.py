"""`--local-peers N`: real peer processes on this machine, joined over loopback, that die with their parent."""
from __future__ import annotations

import ctypes
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

from peers import cache_dir

from .pinning import CORES_ENV

PR_SET_PDEATHSIG = 1
MAX_RESTARTS = 5  # a peer that keeps dying (it cannot load the model, say) is not started over and over
PARENT_PID = "SFCHAT_DIE_WITH_PARENT"
KEY_ENV = "SFCHAT_MEMBER_KEY"  # a local peer's join key: started again, it takes its lost place (number, row) back
# -P: the installed sfchat, never a folder named sfchat (or peers, torch …) in the current directory
SFCHAT = [sys.executable, "-P", "-m", "sfchat"]


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process that dies with this one (see die_with_parent)."""
    return (os.environ if env is None else env) | {PARENT_PID: str(os.getpid())}


def die_with_parent() -> None:
    """In a child started with child_env: SIGTERM when the parent goes, even by SIGKILL.

    Set here in the child, not in a Popen preexec_fn: that runs Python between fork and exec, which can deadlock
    in a parent with other threads (CUDA's, say) holding a lock at the fork."""
    pid = os.environ.pop(PARENT_PID, None)
    if pid is None:
        return
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return  # not Linux: the parent still terminates its children on exit
    if os.getppid() != int(pid):  # the parent went before the line above took effect
        raise SystemExit(0)


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
                 quant: str = "auto", graphs: bool = True, extra: list[str] | None = None,
                 cores: tuple[list[int], ...] = (), own: tuple[list[str], ...] = ()):
        """`cores` (bench --pin): peer i pins itself to cores[i] as it starts; `own`: peer i's own join flags
        (bench --member-threads…), after the common ones so they win."""
        self.procs: list[subprocess.Popen] = []
        logs = cache_dir() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.log_paths: list[Path] = []
        self.specs: list[tuple[list[str], dict[str, str]]] = []  # how each was started: how it starts again
        self.restarts = [0] * n
        env = child_env() | {"SFCHAT_TOKEN": token}  # not in argv: any user of the machine reads that in `ps`
        for i in range(n):
            cmd = [*SFCHAT, "join", host_addr, "--headless",
                   "--name", local_name(i), "--listen", "127.0.0.1:0", "--dtype", dtype, "--quant", quant,
                   "--give-up-after", "10s"]  # cut off by its host, it joins again at once, its layers kept
            if not graphs:
                cmd.append("--no-graphs")
            if model:
                cmd += ["--model", model]
            cmd += extra or []
            cmd += own[i] if i < len(own) else []
            path = logs / f"local-peer-{os.getpid()}-{i + 1}.log"
            self.log_paths.append(path)
            pin = {CORES_ENV: ",".join(map(str, cores[i]))} if i < len(cores) else {}
            own_env = env | pin | {KEY_ENV: secrets.token_hex(8)}  # (the same key when it is started again)
            self.specs.append((cmd, own_env))
            self.procs.append(self.start(cmd, path, own_env))

    def start(self, cmd: list[str], log: Path, env: dict[str, str], mode: str = "w") -> subprocess.Popen:
        """Peer process `cmd`, its output into `log`. In a session of its own: a terminal's Ctrl+C goes to the
        host alone, which stops its peers as it ends (none is seen to die and started again meanwhile)."""
        with open(log, mode) as out:
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)

    def check(self) -> None:
        for i, p in enumerate(self.procs):
            if p.poll() is not None:
                tail = self.log_paths[i].read_text().strip().splitlines()[-1:] or ["(no output)"]
                raise RuntimeError(f"a local peer (pid {p.pid}) exited with {p.returncode}: {tail[0]}")

    def revive(self) -> list[str]:
        """Reap each peer that exited (a dead child stays <defunct> until its parent waits for it) and start it
        again, with the same name, so it rejoins and the ring is planned over it again; a line for each, to log."""
        lines = []
        for i, p in enumerate(self.procs):
            if p.poll() is None or self.restarts[i] > MAX_RESTARTS:
                continue
            self.restarts[i] += 1
            if self.restarts[i] > MAX_RESTARTS:
                lines.append(f"local peer {local_name(i)} exited with {p.returncode} again; not restarting it "
                             f"(see {self.log_paths[i]})")
                continue
            cmd, env = self.specs[i]
            self.procs[i] = self.start(cmd, self.log_paths[i], env, "a")
            lines.append(f"local peer {local_name(i)} (pid {p.pid}) exited with {p.returncode}; restarted it "
                         f"as pid {self.procs[i].pid}")
        return lines

    def tails(self, lines: int = 20) -> str:
        """The last lines each peer wrote, for a failure's report."""
        return "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-lines:])
                         for p in self.log_paths if p.exists())

    def close(self) -> None:
        stop(self.procs)
        for path in self.log_paths:
            path.unlink(missing_ok=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
