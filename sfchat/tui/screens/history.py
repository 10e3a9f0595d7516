"""The saved chats, newest first; choosing one reopens it."""
from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, ListItem, ListView, Static

from sfchat import store


class HistoryScreen(ModalScreen[str | None]):
    """Dismisses with the chosen chat's id, or None."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Close")]

    def compose(self) -> ComposeResult:
        chats = store.list_chats()
        with Vertical(id="history"):
            yield Static(f"[b]Saved chats[/b] ({len(chats)}) — Enter opens, Esc closes")
            items = [ListItem(Label(Text.assemble(time.strftime("%Y-%m-%d %H:%M  ", time.localtime(c.updated)),
                                                  c.title, (f"  ({len(c.messages)} messages)", "dim"))),
                              name=c.id) for c in chats]
            yield ListView(*items, id="chats")

    def on_list_view_selected(self, event: ListView.Selected) -> None:
        self.dismiss(event.item.name)
