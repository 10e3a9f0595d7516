"""The peer's own screen (`sfchat join`): its layers, device, memory, sessions, compute per frame, its links."""
from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header, Log, Sparkline, Static

from ..messages import Ended, EngineFailed, LogLine, PeerChanged
from ..widgets.fmt import ms, size


class PeerScreen(Screen):
    def __init__(self) -> None:
        super().__init__()
        self.state = None  # the latest PeerState snapshot

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical(id="peer-panel") as panel:
            panel.border_title = "this peer"
            yield Static(id="peer-info")
            yield Static("compute per frame", id="compute-label")
            yield Sparkline([], id="compute-spark")
        log = Log(id="peer-log", max_lines=500)
        log.border_title = "log"
        yield log
        yield Footer()

    def on_peer_changed(self, msg: PeerChanged) -> None:
        st = self.state = msg.state
        recent = st.compute_ms[-20:]
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold", min_width=12)
        grid.add_column()
        for row in (("state", st.state + (f" — {st.error}" if st.error else "")),
                    ("layers", str(st.span) if st.span else "—"),
                    ("device", st.device),
                    ("memory", f"{size(st.rss)} (peak {size(st.peak)})"),
                    ("sessions", f"{st.sessions} now, {st.frames} frames served"),
                    ("compute", f"{ms(st.compute_ms[-1])} last, {ms(sum(recent) / len(recent))} avg of "
                                f"{len(recent)}" if recent else "—"),
                    ("link", f"host {st.host} → this peer → {st.next_hop or '…'}")):
            grid.add_row(*row)
        self.query_one("#peer-info", Static).update(grid)
        self.query_one("#compute-spark", Sparkline).data = list(st.compute_ms[-120:])
        self.sub_title = st.state

    def on_log_line(self, msg: LogLine) -> None:
        self.query_one(Log).write_line(msg.text)

    def on_ended(self, msg: Ended) -> None:
        self.app.ended = msg.why
        self.app.exit(return_code=0)

    def on_engine_failed(self, msg: EngineFailed) -> None:
        self.app.fatal = msg.error
        self.sub_title = "stopped"
        self.query_one(Log).write_line(f"stopped: {msg.error}")
        self.notify(f"{msg.error} (Ctrl+Q quits)", title="the peer stopped", severity="error", timeout=30)
