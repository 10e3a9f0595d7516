"""What the user sees of an error: one line, the first error sfchat expects, dug out of trio's exception groups
(anything else is a bug and keeps its traceback)."""
from __future__ import annotations

import trio

from peers import AuthError
from peers import ChannelClosed
from peers import ModelError, RingError

from .invite import program

EXPECTED = (ModelError, AuthError, RingError, ValueError, OSError, ChannelClosed, RuntimeError,
            trio.TooSlowError, KeyboardInterrupt)


def user_error(e: BaseException) -> BaseException | None:
    """The error to show the user in one line: the first expected one, dug out of trio's exception groups."""
    if isinstance(e, BaseExceptionGroup):
        for sub in e.exceptions:
            if (found := user_error(sub)) is not None:
                return found
        return None
    if isinstance(e, trio.TooSlowError):
        return TimeoutError("timed out")
    return e if isinstance(e, EXPECTED) else None


def runnable(message: str) -> str:
    """The engine's hints name `sfchat …`; when sfchat is not on PATH, name the command that runs it here."""
    return message.replace("`sfchat ", f"`{program()} ")
