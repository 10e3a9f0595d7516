"""The Textual front end: `sfchat host` and `sfchat join` on a terminal."""
from __future__ import annotations

import logging
import sys

from peers.locations import cache_dir
from sfchat.invite import program


def log_to_file(name: str) -> None:
    """The terminal belongs to Textual: logs go to a file (and, from the app, to the screen)."""
    path = cache_dir() / "logs" / f"{name}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    level = logging.getLogger().level
    logging.basicConfig(filename=path, level=level, force=True,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


def run_host(args) -> int:
    from sfchat import settings, store

    from .app import HostApp

    conv = store.resume(args.resume) if getattr(args, "resume", None) else \
        store.Conversation(model=args.model or "", temperature=args.temperature)
    log_to_file("host")
    app = HostApp(args, settings.load(), conv)
    try:
        app.run()
    finally:
        if app.engine is not None:
            app.engine.close()
    chat = app.main_screen.conv if hasattr(app, "main_screen") else conv
    if chat.messages:
        print(f"chat saved; reopen it with: {program()} host --resume {chat.id}")
    return finish(app, "host")


def run_peer(args) -> int:
    from .app import PeerApp

    log_to_file(f"peer-{args.name}")
    app = PeerApp(args)
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
