"""What the engine (trio thread) tells the UI: Textual messages, posted thread-safely, never blocking trio."""
from __future__ import annotations

from textual.message import Message


class Status(Message):
    """A line of progress while the ring comes up (model resolving, peers joining)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class RingChanged(Message):
    def __init__(self, members: list[dict], invite: str, serving: str = "") -> None:
        super().__init__()
        self.members, self.invite, self.serving = members, invite, serving


class Ready(Message):
    """The ring is planned; prompts are answered from now on."""

    def __init__(self, model: str, drafter: str) -> None:
        super().__init__()
        self.model, self.drafter = model, drafter


class AnswerDelta(Message):
    def __init__(self, n: int, text: str) -> None:
        super().__init__()
        self.n, self.text = n, text


class RoundDone(Message):
    """One verify round of answer `n`: the engine's round event (round timings, running stats)."""

    def __init__(self, n: int, event: dict) -> None:
        super().__init__()
        self.n, self.event = n, event


class Recovering(Message):
    def __init__(self, n: int, error: str) -> None:
        super().__init__()
        self.n, self.error = n, error


class AnswerDone(Message):
    """`finish`: eos, length (the limit cut it), stopped; `dropped`: oldest messages left out to fit the context."""

    def __init__(self, n: int, text: str, finish: str, messages: list[dict], drafter: str, dropped: int = 0,
                 cut_by_context: bool = False) -> None:
        super().__init__()
        self.n, self.text, self.finish, self.messages, self.drafter = n, text, finish, messages, drafter
        self.dropped, self.cut_by_context = dropped, cut_by_context


class DraftChecked(Message):
    """`/draft SPEC` was tried in the engine: `error` is None when it loaded (and is in use from now on)."""

    def __init__(self, spec: str, error: str | None, name: str = "") -> None:
        super().__init__()
        self.spec, self.error, self.name = spec, error, name


class Ended(Message):
    """The peer's ring ended normally (the host closed it): the app exits 0 and says why."""

    def __init__(self, why: str) -> None:
        super().__init__()
        self.why = why


class AnswerFailed(Message):
    def __init__(self, n: int, error: str, messages: list[dict]) -> None:
        super().__init__()
        self.n, self.error, self.messages = n, error, messages


class EngineFailed(Message):
    """The ring could not be brought up or broke for good; the app stays open to show why."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class LogLine(Message):
    def __init__(self, level: int, text: str) -> None:
        super().__init__()
        self.level, self.text = level, text


class PeerChanged(Message):
    """A snapshot of the peer's state (a copy: the trio thread keeps mutating its own)."""

    def __init__(self, state) -> None:
        super().__init__()
        self.state = state
