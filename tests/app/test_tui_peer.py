"""The peer's screen (`sfchat join` on a terminal), driven by the pilot, serving a real headless host."""
from __future__ import annotations

import asyncio
import logging
import subprocess

from apps import headless_host
from helpers import free_port, until
from sfchat.cli import parser
from sfchat.options import join_options
from sfchat.tui.app import PeerApp
from textual.widgets import Log, Sparkline


def test_peer_screen_follows_a_real_ring(tiny_llama, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="sfchat.peer")  # `sfchat join` logs at INFO; its screen shows the log
    port, token = free_port(), "peer-screen-test"
    host = headless_host(tiny_llama, port, token, tmp_path, subprocess.PIPE, "--max-new-tokens", "16",
                         "--temperature", "0")
    try:
        args = parser().parse_args(["join", f"127.0.0.1:{port}", "--token", token, "--model", str(tiny_llama),
                                    "--listen", "127.0.0.1:0", "--name", "tuipeer",
                                    "--give-up-after", "0"])  # (by default it would wait for the host's return)
        app = PeerApp(join_options(args))

        async def main():
            async with app.run_test(size=(120, 36)) as pilot:
                scr = app.main_screen
                await until(pilot, lambda: scr.state is not None and scr.state.state == "ready", "the peer to be ready")
                assert scr.state.span is not None and scr.state.span.size > 0
                assert scr.state.next_hop.startswith("127.0.0.1:")
                # the host answers a prompt: this peer computes frames and its sparkline fills
                host.stdin.write("hello world\n")
                host.stdin.flush()
                spark = scr.query_one("#compute-spark", Sparkline)
                await until(pilot, lambda: scr.state.frames >= 3 and spark.data, "frames served")
                assert scr.state.sessions == 1  # the one conversation the host answered
                assert any("joined" in line for line in scr.query_one(Log).lines)
                host.stdin.close()  # the host ends its loop and says bye to the ring: a normal end, exit 0
                await until(pilot, lambda: app.ended, "the host to close the ring")

        asyncio.run(main())
        assert app.ended == "the host closed the ring" and app.return_code == 0 and app.fatal is None
        assert host.wait(30) == 0
    finally:
        if host.poll() is None:
            host.kill()


def test_a_refused_peer_shows_why_and_exits_nonzero(tiny_llama, tmp_path):
    """A joiner with a wrong token: the screen says so, and Ctrl+Q exits 1 (a fatal error, not a normal end)."""
    port = free_port()
    host = headless_host(tiny_llama, port, "the-right-one", tmp_path, subprocess.DEVNULL)
    try:
        args = parser().parse_args(["join", f"127.0.0.1:{port}", "--token", "wrong", "--model", str(tiny_llama),
                                    "--listen", "127.0.0.1:0"])
        app = PeerApp(join_options(args))

        async def main():
            async with app.run_test(size=(120, 36)) as pilot:
                await until(pilot, lambda: app.fatal is not None, "the refusal", 30)
                assert app.main_screen.sub_title == "stopped"
                await pilot.press("ctrl+q")

        asyncio.run(main())
        assert app.return_code == 1 and "token" in app.fatal
    finally:
        host.kill()
        host.wait()
