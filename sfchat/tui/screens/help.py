"""Help: the commands and the keys; F2 from here shows the stats panel's legend."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from ..commands import HELP
from ..widgets.fmt import two_columns


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close"), Binding("f2", "legend", "Stats legend")]

    def __init__(self, keys: list[tuple[str, str]]) -> None:
        super().__init__()
        self.keys = keys

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Static("[b]Commands[/b] — type them in the prompt line")
            yield Static(two_columns(HELP), id="help-commands")
            yield Static("[b]Keys[/b]")
            yield Static(two_columns(self.keys), id="help-keys")
            yield Static("Esc closes this screen; F2 explains the stats panel.", id="help-close")

    def action_legend(self) -> None:
        from .legend import LegendScreen

        self.app.switch_screen(LegendScreen())
