"""The ring panel: every member with address, layers, device, measured ms per layer and share of the predicted time
per token, memory in use and its peak (resident set on a CPU, allocated tensors on a GPU), round-trip time and state
(a spare holds no layers: the plan by speed left it out, and uses it first when a member fails; a held one broke
twice within a minute and is planned in again when its hold ends); the invite, its command on one line that never wraps
(a TLS fingerprint broken over lines cannot be selected and pasted); with --serve, the endpoint, its requests in
flight and the conversations each member holds caches for."""
from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.widgets import DataTable, Static

from .fmt import ms, size

# the state and the plan's figures before the device and memory: where the panel is narrow, those are cut off
COLUMNS = ("name", "address", "layers", "state", "ms/layer", "share", "device", "memory", "peak", "rtt")
WIDTHS = {"layers": 7, "ms/layer": 8, "share": 5, "memory": 8, "peak": 8, "rtt": 8, "state": 8}  # these change in place: fixed, so no re-layout
NOTE_WIDTH = 46  # the invite's note beside the table: #invite's width and padding in sfchat.tcss
STATE_STYLES = {"ready": "$success", "joining": "$warning", "loading": "$warning", "spare": "$text-muted",
                "held": "$warning", "idle": "$text-muted",
                "lost": "$error", "failed": "$error", "waiting": "$error", "left": "$text-muted"}


def speed(m: dict) -> str:
    """Its measured ms per reference layer (peers/compute/speed.py); — where it did not measure."""
    return "—" if m.get("ms_per_layer") is None else f"{m['ms_per_layer']:.2f}"


def share(m: dict) -> str:
    """Its part of the predicted time per token under the plan."""
    return f"{100 * m['share']:.0f}%" if m.get("share") and m.get("layers") else "—"


def state_cell(state: str) -> Content:
    return Content.styled(state, STATE_STYLES.get(state, ""))


def by_layers(members: list[dict]) -> list[dict]:
    """In pass order: by the first layer each holds ("10-19": 10); members without layers after, as they came."""
    def first(m: dict) -> float:
        head = (m.get("layers") or "").partition("-")[0]
        return int(head) if head.isdigit() else float("inf")
    return sorted(members, key=first)


def fit_command(command: str, width: int) -> str:
    """The invite command in `width` columns: whole where it fits, else with the TLS fingerprint shortened to its
    ends (enough to compare by eye; Ctrl+T copies it whole)."""
    head, tls, fp = command.partition(" --tls ")
    if len(command) <= width or not tls or len(fp) <= 20:
        return command
    return f"{head}{tls}{fp[:8]}…{fp[-8:]}"


class InviteCommand(Static):
    """The command to run on another machine, on one line as wide as the panel."""

    def __init__(self, **kw) -> None:
        super().__init__("", **kw)
        self.command = ""

    def show(self, command: str) -> None:
        self.command = command
        self.refresh()

    def render(self) -> Text:
        return Text(fit_command(self.command, self.size.width), style="bold", no_wrap=True, overflow="ellipsis")


class RingPanel(Vertical):
    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.border_title = "ring"
        self.invite = self.serving = ""

    @property
    def command(self) -> str:
        """The invite's command alone (what Ctrl+T copies), without the notes under it."""
        return self.invite.partition("\n")[0]

    def compose(self) -> ComposeResult:
        with Horizontal(id="ring-top"):
            yield DataTable(id="members", cursor_type="none", show_cursor=False, zebra_stripes=True)
            yield Static("", id="invite")
        yield InviteCommand(id="invite-command")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for name in COLUMNS:
            table.add_column(name, key=name, width=WIDTHS.get(name))
        self.watch(table, "virtual_size", lambda _: self.fit(), init=False)  # (columns widen with their rows)

    def on_resize(self) -> None:
        self.fit()

    def fit(self) -> None:
        """Where the table and the invite's note do not fit side by side (a 100-column terminal), the note goes
        under the table: a table cut short loses its last column, the members' state."""
        wide = self.query_one(DataTable).virtual_size.width + NOTE_WIDTH
        self.set_class(wide > self.content_size.width, "narrow")

    def show(self, members: list[dict], invite: str, serving: str = "") -> None:
        table = self.query_one(DataTable)
        rows = {str(m["id"]): (m["name"], m["address"], m["layers"] or "—", state_cell(m["state"]), speed(m),
                               share(m), m["device"], size(m["memory_bytes"]), size(m.get("peak_memory_bytes")),
                               ms(m["rtt_ms"]))
                for m in by_layers(members)}
        if list(rows) != [key.value for key in table.rows]:  # members came, went or moved: rebuild
            table.clear()
            for key, cells in rows.items():
                table.add_row(*cells, key=key)
        else:  # every heartbeat changes a round-trip time: touch only the cells that changed
            for key, cells in rows.items():
                for column, value in zip(COLUMNS, cells):
                    if table.get_cell(key, column) != value:
                        table.update_cell(key, column, value)
        if serving:
            serving += " · caches held: " + ", ".join(f"{m['name']} {m['conversations']}" for m in members
                                                      if m.get("conversations") is not None and m["layers"])
        if (invite, serving) != (self.invite, self.serving):
            self.invite, self.serving = invite, serving
            notes = self.invite.partition("\n")[2]
            self.query_one("#invite", Static).update(Text.assemble(
                ("invite", "bold"), ": to join, run the command below on another machine (Ctrl+T copies it)",
                *(("\n", (notes, "dim")) if notes else ()),
                *(("\n", ("serving", "bold"), " ", serving) if serving else ())))
            self.query_one(InviteCommand).show(self.command)
