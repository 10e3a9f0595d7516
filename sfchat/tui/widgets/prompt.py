"""The prompt line: Textual's Input plus a history walked with up and down, like a shell."""
from __future__ import annotations

from textual.binding import Binding
from textual.widgets import Input


class PromptInput(Input):
    BINDINGS = [Binding("up", "history(-1)", "Previous", show=False),
                Binding("down", "history(1)", "Next", show=False)]

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.history: list[str] = []
        self._pos = 0  # len(history) = the line being typed
        self._typed = ""  # what was on the line before walking the history

    def remember(self, text: str) -> None:
        if text and (not self.history or self.history[-1] != text):
            self.history.append(text)
        self._pos = len(self.history)

    def action_history(self, step: int) -> None:
        if not self.history:
            return
        if self._pos == len(self.history):
            self._typed = self.value
        self._pos = min(max(self._pos + step, 0), len(self.history))
        self.value = self.history[self._pos] if self._pos < len(self.history) else self._typed
        self.cursor_position = len(self.value)
