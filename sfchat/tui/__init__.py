"""The Textual front end: `sfchat host` and `sfchat join` on a terminal."""
from __future__ import annotations

import logging
import sys

from peers import cache_dir
from sfchat.invite import program
from sfchat.options import JoinOptions, RingOptions
from sfchat.settings import Settings


def log_to_file(name: str) -> None:
    """The terminal belongs to Textual: logs go to a file (and, from the app, to the screen)."""
    path = cache_dir() / "logs" / f"{name}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    level = logging.getLogger().level
    logging.basicConfig(filename=path, level=level, force=True,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


def run_host(opts: RingOptions, settings: Settings, resume: str | None = None) -> int:
    from sfchat import store

    from .app import HostApp

    conv = store.resume(resume) if resume else \
        store.Conversation(model=opts.host.model or "", temperature=opts.answer.temperature)
    log_to_file("host")
    app = HostApp(opts, settings, conv)
    try:
        app.run()
    finally:
        if app.engine is not None:
            app.engine.close()
    chat = app.main_screen.conv if hasattr(app, "main_screen") else conv
    if chat.messages:
        print(f"chat saved; reopen it with: {program()} host --resume {chat.id}")
    return finish(app, "host")


def run_peer(opts: JoinOptions) -> int:
    from .app import PeerApp

    log_to_file(f"peer-{opts.peer.name}")
    app = PeerApp(opts)
    try:
        app.run()
    finally:
        if app.engine is not None:
            app.engine.close()
    return finish(app, "join")


def finish(app, command: str) -> int:
    """The exit status, the reason said again on the terminal (the screen that showed it is gone)."""
    if app.fatal:
        print(f"sfchat {command}: {app.fatal}", file=sys.stderr)
        return app.return_code or 1
    if app.ended:
        print(f"sfchat {command}: {app.ended}", file=sys.stderr)
    return app.return_code or 0
