"""Driving sfchat's apps in tests: the host app under Textual's pilot, and a headless host in its own process
(shared by the app tests and the ring tests that check a partial ring through them)."""
from __future__ import annotations

import subprocess
import sys

from helpers import ROOT, child_env, until, wait_for_line
from sfchat import settings, store
from sfchat.cli import parser
from sfchat.options import ring_options
from sfchat.tui.app import HostApp
from sfchat.tui.widgets.conversation import ChatMessage

SIZE = (140, 45)


def host_app(model, *extra: str, conv: store.Conversation | None = None) -> HostApp:
    args = parser().parse_args(["host", "--model", str(model), "--local-peers", "1", "--listen", "127.0.0.1:0",
                                *extra])
    opts = ring_options(args, settings.load())
    return HostApp(opts, settings.load(), conv or store.Conversation(temperature=opts.answer.temperature))


async def ask(app, pilot, text: str) -> ChatMessage:
    await pilot.press(*text, "enter")
    await until(pilot, lambda: not app.main_screen.answering, "the answer")
    return list(app.main_screen.query(ChatMessage))[-1]


def headless_host(model, port: int, token: str, tmp_path, stdout, *extra: str) -> subprocess.Popen:
    """`sfchat host --headless` in its own process, returned once it listens (its log in tmp_path/host.log)."""
    log = open(tmp_path / "host.log", "w")
    host = subprocess.Popen([sys.executable, "-m", "sfchat", "host", "--headless", "--model", str(model),
                             "--listen", f"127.0.0.1:{port}", "--token", token, *extra],
                            stdin=subprocess.PIPE, stdout=stdout, stderr=log, text=True, cwd=ROOT, env=child_env())
    log.close()  # the child writes through its own copy
    wait_for_line(tmp_path / "host.log", "sfchat host on", host)
    return host
