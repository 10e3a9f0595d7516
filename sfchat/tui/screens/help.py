"""Help: the commands and the keys."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from ..commands import HELP


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def __init__(self, keys: list[tuple[str, str]]) -> None:
        super().__init__()
        self.keys = keys

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Static("[b]Commands[/b] — type them in the prompt line")
            commands = DataTable(id="help-commands", cursor_type="none", show_cursor=False)
            commands.add_columns("command", "does")
            commands.add_rows(HELP)
            yield commands
            yield Static("[b]Keys[/b]")
            keys = DataTable(id="help-keys", cursor_type="none", show_cursor=False)
            keys.add_columns("key", "does")
            keys.add_rows(self.keys)
            yield keys
            yield Static("Esc closes this screen.", id="help-close")
