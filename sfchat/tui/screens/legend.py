"""The stats panel's legend: what each of its numbers means, on one screen (F2)."""
from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from ..widgets.stats import LEGEND
from ..widgets.fmt import two_columns


class LegendScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f2,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="legend"):
            yield Static("[b]The stats panel[/b] — the answer being written, or the last one")
            yield Static(two_columns(LEGEND), id="legend-rows")
            yield Static("Esc closes this screen.", id="help-close")
