"""Time how fast `sfchat host` echoes a key press, idle and while the model generates on CPU.

Runs the real app in a pseudo-terminal (as a terminal emulator would), writes one key at a time and measures
until the app has written that key back to the terminal. Private data/config/cache dirs; prints a summary.

    .venv/bin/python scripts/key_echo.py [--model smollm2-135m] [--local-peers 2] [--keys 15]
"""
from __future__ import annotations

import argparse
import fcntl
import os
import pty
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KEY = "Ж"  # a key no English answer prints, so its echo is unambiguous
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]|\x1b\][^\x07]*\x07")


class Terminal:
    def __init__(self, cmd: list[str], env: dict, cols: int = 150, rows: int = 45):
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT,
                                     start_new_session=True)
        os.close(slave)
        self.out = bytearray()
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            with self.lock:
                self.out += data

    def text(self, since: int = 0) -> str:
        with self.lock:
            raw = bytes(self.out[since:])
        return ANSI.sub(b"", raw).decode("utf-8", "replace")

    def mark(self) -> int:
        with self.lock:
            return len(self.out)

    def wait(self, pattern: str, timeout: float, since: int = 0) -> None:
        end = time.monotonic() + timeout
        while not re.search(pattern, self.text(since)):
            if time.monotonic() > end or self.proc.poll() is not None:
                raise SystemExit(f"no {pattern!r} from the app within {timeout} s")
            time.sleep(0.05)

    def send(self, s: str) -> None:
        os.write(self.master, s.encode())

    def echo_ms(self, typed: int) -> float:
        """Send one more KEY; ms until the prompt line shows typed+1 of them."""
        mark = self.mark()
        t0 = time.perf_counter()
        self.send(KEY)
        want = KEY * (typed + 1)
        while want not in self.text(mark):
            if time.perf_counter() - t0 > 5:
                raise SystemExit("a key did not echo within 5 s")
            time.sleep(0.0005)
        return (time.perf_counter() - t0) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--local-peers", default="2")
    ap.add_argument("--keys", type=int, default=15)
    a = ap.parse_args()
    work = tempfile.mkdtemp()
    env = dict(os.environ, TERM="xterm-256color", SFCHAT_DATA_DIR=f"{work}/data", SFCHAT_CONFIG_DIR=f"{work}/config",
               SFCHAT_CACHE_DIR=f"{work}/cache",
               SFCHAT_MODELS_DIR=os.environ.get("SFCHAT_MODELS_DIR", str(ROOT / ".cache" / "models")))
    term = Terminal([sys.executable, "-m", "sfchat", "host", "--model", a.model, "--local-peers", a.local_peers,
                     "--listen", "127.0.0.1:0", "--max-new-tokens", "400", "--temperature", "0"], env)
    try:
        term.wait(r"ready: ", 180)
        time.sleep(1)
        idle = []
        for i in range(a.keys):
            idle.append(term.echo_ms(i))
            time.sleep(0.1)
        term.send("\x15")  # Ctrl+U clears the line
        time.sleep(0.5)
        mark = term.mark()
        term.send("Write a long story about a dragon who learns to code.\r")
        term.wait(r"tokens/round\s+\d", 120, since=mark)  # 400 tokens on CPU outlast the keys by far
        time.sleep(1)
        busy = []
        for i in range(a.keys):
            busy.append(term.echo_ms(i))
            time.sleep(0.1)
        for name, xs in (("idle", idle), ("generating", busy)):
            print(f"key echo {name}: median {statistics.median(xs):.1f} ms, p90 "
                  f"{sorted(xs)[int(0.9 * len(xs))]:.1f} ms, max {max(xs):.1f} ms (n={len(xs)})")
        term.send("\x1b")
        time.sleep(1)
        term.send("\x11")  # Ctrl+Q
        term.proc.wait(30)
        return 0
    finally:
        if term.proc.poll() is None:
            os.killpg(term.proc.pid, 15)


if __name__ == "__main__":
    sys.exit(main())
