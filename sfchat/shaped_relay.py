"""A shaping relay for the benches: an `sfchat relay` process that delays every link it forwards, so a ring on one
machine sees the round trip of one spread over several."""
from __future__ import annotations

import subprocess
import sys
from contextlib import asynccontextmanager

import trio

from .local import child_env, stop


@asynccontextmanager
async def shaped_relay(delay_ms: float):
    """An `sfchat relay` process adding delay_ms one way on every link; yields its HOST:PORT (None if no delay)."""
    if delay_ms <= 0:
        yield None
        return
    proc = subprocess.Popen([sys.executable, "-P", "-m", "sfchat", "relay", "--listen", "127.0.0.1:0", "--delay-ms",
                             f"{delay_ms:.4f}"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, text=True, env=child_env())
    try:
        with trio.fail_after(60):
            line = await trio.to_thread.run_sync(proc.stdout.readline, abandon_on_cancel=True)
        if not line.startswith("relay listening on "):
            raise RuntimeError(f"the relay did not start: {line!r}")
        yield line.split()[3]
    finally:
        stop([proc])
