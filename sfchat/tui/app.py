"""The two Textual apps: the host's chat (`sfchat host`) and the peer's screen (`sfchat join`)."""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from textual.app import App
from textual.binding import Binding

from sfchat import store
from sfchat.options import JoinOptions, RingOptions
from sfchat.settings import Settings

from .bridge import Engine, PeerWorker, UILogHandler
from .screens.chat import ChatScreen
from .screens.peer import PeerScreen

CSS = Path(__file__).resolve().parent.parent / "sfchat.tcss"


class SfchatApp(App):
    """What both apps share: the styles, the quit key, and one trio worker stopped on the way out."""

    CSS_PATH = CSS
    TITLE = "sfchat"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [Binding("ctrl+q", "quit", "Quit", priority=True)]
    LOG_LEVEL = logging.WARNING

    def __init__(self, start_engine: bool = True) -> None:
        super().__init__()
        self.start_engine = start_engine
        self.engine = None
        self.log_handler: UILogHandler | None = None
        self.fatal: str | None = None  # the error that stopped the engine: shown, then the exit status is 1
        self.ended = ""  # why the app ended on its own (a joiner whose host closed the ring)

    def make_worker(self, post):
        raise NotImplementedError

    def on_mount(self) -> None:
        post = self.main_screen.post_message  # the default screen handles what the engine says
        if self.start_engine:
            self.log_handler = UILogHandler(post, self.LOG_LEVEL)
            logging.getLogger().addHandler(self.log_handler)
            self.engine = self.make_worker(post)
            self.engine.start()

    async def action_quit(self) -> None:
        if self.engine is not None:
            self.notify("Stopping…")
            await asyncio.to_thread(self.engine.close)  # the ring says bye, local peer processes are ended
        self.exit(return_code=1 if self.fatal else 0)

    def on_unmount(self) -> None:
        if self.engine is not None and self.engine.thread.is_alive():  # ended without the quit action (a test's
            self.engine.close()  # run_test, say): its ring must not outlive the app, nor log into what runs next
        if self.log_handler is not None:
            logging.getLogger().removeHandler(self.log_handler)


class HostApp(SfchatApp):
    def __init__(self, opts: RingOptions, settings: Settings, conv: store.Conversation,
                 start_engine: bool = True) -> None:
        super().__init__(start_engine)
        self.opts, self.settings, self.conv = opts, settings, conv

    def get_default_screen(self) -> ChatScreen:
        self.main_screen = ChatScreen(self.opts, self.settings, self.conv)
        return self.main_screen

    def make_worker(self, post) -> Engine:
        return Engine(self.opts, post, messages=self.conv.messages)


class PeerApp(SfchatApp):
    SUB_TITLE = "peer"
    LOG_LEVEL = logging.INFO

    def __init__(self, opts: JoinOptions, start_engine: bool = True) -> None:
        super().__init__(start_engine)
        self.opts = opts

    def get_default_screen(self) -> PeerScreen:
        self.main_screen = PeerScreen()
        return self.main_screen

    def make_worker(self, post) -> PeerWorker:
        return PeerWorker(self.opts, post)
