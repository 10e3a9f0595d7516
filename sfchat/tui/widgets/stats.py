"""The stats panel: speed, a sparkline of tokens/s, tokens and acceptance per round, K, rounds in flight (and
those cancelled, and the hedges that caught a rejection), the round's time split.

Counts and averages are over one span, the answer being written (or the last one); totals since the app started
sit apart. A round is one trip around the ring: the host sends the drafts, every member computes, the host
verifies and commits the accepted tokens plus one of its own. "Tokens per round" is the figure's one name, here,
in `sfchat bench` and in the JSON (tokens_per_round)."""
from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Sparkline, Static

from .fmt import ms, pct, plural

SPARK_POINTS = 60
# what the panel's rows mean (F2 shows it): a round is one trip around the ring, the unit every number here counts
LEGEND = [
    ("tok/s", "new tokens per second of the answer. now: over its last 8 rounds (once the prompt is read); avg: "
              "all its tokens over its whole time, the prompt's reading (prefill) and the first token included, as "
              "in ask --json and sfchat bench; peak: the best \"now\""),
    ("(the line)", f"tok/s now after each round, the last {SPARK_POINTS} rounds, the newest on the right"),
    ("tokens/round", "tokens the answer gained per round, one trip around the ring (the host sends its drafted "
                     "guesses, every member runs its layers, the host checks the guesses): avg over the answer, and "
                     "the last round's (rounds a verdict cancelled not counted). Above 1 means guesses were right: "
                     "several tokens for the time of one"),
    ("accepted", "the share of drafted tokens the model agreed with (accepted/drafted)"),
    ("K", "drafted tokens sent per round: avg and last. (tree N deep, M taken): the last round's guesses were a "
          "tree (second and third guesses where the draft was unsure, each with its own continuation) of N "
          "levels, and the model took M of them, one per level down the tree. The K setting below is what you "
          "chose: /k"),
    ("in flight", "the answer's rounds on the ring at once, counted as each is sent (itself included): avg and "
                  "last. 1: each waited for the one before it; more keep a slow link busy (--in-flight)"),
    ("cancelled", "the share of rounds an earlier round's check proved all wrong before they came back"),
    ("hedges caught", "wrong guesses a round already in flight had covered with the model's token: no trip lost"),
    ("last round", "how long the last round took, split into:"),
    ("  draft", "guessing on the host (what could not overlap the round before)"),
    ("  host", "the host's own layers, embedding and head, and checking the guesses against what the model chose"),
    ("  network", "the hidden states in transit between members"),
    ("  peers", "the other members' layers, added up"),
    ("since start", "answers and tokens since sfchat started, and their tokens per second (prefill included)"),
    ("temp … draft", "the settings the next answer uses: /temp, /k and /draft change them"),
]
REFRESH_S = 0.1  # a tiny model commits ~100 rounds a second; redrawing the panel that often starves the keyboard


def _grid(rows: list[tuple[str, str]]) -> Table:
    t = Table.grid(padding=(0, 1))
    t.add_column(style="bold", min_width=10)
    t.add_column()
    for r in rows:
        t.add_row(*r)
    return t


class StatsPanel(Vertical):
    """Speed and rounds of the answer being written (or the last one), the chat's totals apart, the settings."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.border_title = "stats"
        self.border_subtitle = "F2 explains"
        self.history: list[float] = []  # tokens/s now, after each round of every answer in this session
        self.latest: dict | None = None
        self.dirty = False
        self.live = False  # an answer is being written: "now" means something
        self.totals = {"answers": 0, "tokens": 0, "seconds": 0.0}

    def compose(self) -> ComposeResult:
        yield Static(id="speed")
        yield Sparkline([], id="tps-spark")
        yield Static(id="rounds")
        yield Static(id="session")
        yield Static(id="settings")

    def on_mount(self) -> None:
        self.show_round(None)
        self.show_session()
        self.set_interval(REFRESH_S, self.flush)

    def add_round(self, event: dict) -> None:
        """One round event of the engine; shown at the next refresh."""
        self.history = (self.history + [event["stats"].get("tokens_per_second_now", 0.0)])[-SPARK_POINTS:]
        self.latest, self.dirty, self.live = event, True, True

    def answer_done(self) -> None:
        """The answer ended: "now" is no speed any more; its totals join the session's."""
        s = (self.latest or {}).get("stats", {})
        if self.live and s:
            self.totals["answers"] += 1
            self.totals["tokens"] += s.get("tokens", 0)
            self.totals["seconds"] += s.get("seconds", 0.0)
        self.live, self.dirty = False, False
        self.show_round(self.latest)
        self.show_session()

    def flush(self) -> None:
        if self.dirty:
            self.dirty = False
            self.show_round(self.latest, layout=False)  # same rows, same size: skip the screen's re-layout

    def show_round(self, event: dict | None, layout: bool = True) -> None:
        r, s = (event or {}).get("round", {}), (event or {}).get("stats", {})
        speed = Table.grid(padding=(0, 1))
        speed.add_column(style="bold", min_width=10)
        for _ in range(3):
            speed.add_column(justify="right", min_width=6)
        speed.add_row("", *(Text(h, style="dim") for h in ("now", "avg", "peak")))
        keys = ("tokens_per_second_now" if self.live else "", "tokens_per_second", "tokens_per_second_peak")
        speed.add_row("tok/s", *(f"{s[key]:.1f}" if key in s else "—" for key in keys))
        self.query_one("#speed", Static).update(speed, layout=layout)
        self.query_one("#tps-spark", Sparkline).data = list(self.history)
        peers = [ms for _, ms in r.get("peers", [])]
        rounds = s.get("rounds") or 0
        title = Text("this answer" if self.live or not r else "the last answer", style="dim")
        self.query_one("#rounds", Static).update(_stack(title, _grid([
            # one round = one trip around the ring: the host sends drafts, every member computes, the host verifies
            ("tokens/round", f"{s['tokens_per_round']:.2f} avg, {r['committed']} last" if r else "—"),
            ("accepted", f"{pct(s.get('acceptance'))} ({s.get('accepted', 0)}/{s.get('drafted', 0)} drafts)"
             if s else "—"),
            # K measured: drafts sent per round (the setting, pinned or adaptive, is shown apart below)
            ("K", f"{s.get('drafted', 0) / rounds:.1f} avg, {r['k']} last{_shape(r)}" if r and rounds else "—"),
            # rounds in flight: sent before the one before them came back (1: each waited)
            ("in flight", f"{s.get('rounds_in_flight', 1.0):.1f} avg, {r.get('in_flight', 1)} last"
             if r and rounds else "—"),
            ("cancelled", f"{pct(s.get('cancelled_share', 0.0))} of rounds" if r and rounds else "—"),
            ("hedges caught", str(s.get("hedges_caught", 0)) if r and rounds else "—"),
            ("last round", ms(r.get("round_ms"))),
            ("  draft", ms(r.get("draft_ms"))),
            # checking the guesses takes microseconds (a tenth of a ms shows 0.0): it counts with the host's work
            ("  host", ms(r["host_ms"] + r["verify_ms"]) if r else "—"),
            ("  network", ms(r.get("network_ms"))),
            ("  peers", ms(sum(peers)) if r else "—"),
        ])), layout=layout)

    def show_session(self) -> None:
        t = self.totals
        self.query_one("#session", Static).update(_grid([
            ("since start", f"{plural(t['answers'], 'answer')}, {plural(t['tokens'], 'token')}"),
            ("", f"{t['tokens'] / t['seconds']:.1f} tok/s avg" if t["seconds"] else "")]))

    def show_settings(self, temperature: float, k: int | None, drafter: str) -> None:
        self.query_one("#settings", Static).update(_grid([
            ("temp", f"{temperature:g}"), ("K setting", "auto (adapts)" if k is None else f"{k} (pinned)"),
            ("draft", drafter)]))


def _shape(r: dict) -> str:
    """A tree round's shape: its levels and how far down the model took it."""
    return f" (tree {r.get('depth', 0)} deep, {r['accepted']} taken)" if r.get("tree") and r.get("drafted") else ""


def _stack(*parts) -> Table:
    t = Table.grid()
    for p in parts:
        t.add_row(p)
    return t
