"""Snapshots of the host, help and peer screens, fed fixed data (no ring, no timings) so they never drift.

Update after an intended change with: pytest tests/app/test_tui_snapshots.py --snapshot-update
"""
from __future__ import annotations

import asyncio
import logging
import re

from peers.member.peer import PeerState
from peers.compute.shard import Span
from sfchat import settings, store
from sfchat.cli import parser
from sfchat.options import join_options, ring_options
from sfchat.tui.app import HostApp, PeerApp
from sfchat.tui.messages import LogLine, PeerChanged, Ready, RingChanged
from sfchat.tui.widgets.prompt import PromptInput
from sfchat.tui.widgets.ring import COLUMNS, RingPanel
from sfchat.tui.widgets.stats import StatsPanel
from textual.widgets import DataTable, Log

from helpers import until

SIZE = (140, 42)
MB = 2**20
MEMBERS = [
    {"id": 0, "name": "host", "address": "192.168.1.10:7340", "device": "cuda", "layers": "0-9", "state": "ready",
     "rtt_ms": 0.0, "memory_bytes": 1900 * MB, "peak_memory_bytes": 2300 * MB,
     "free_bytes": 0, "ms_per_layer": 0.31, "share": 0.2},
    {"id": 1, "name": "laptop", "address": "192.168.1.21:40111", "device": "cpu", "layers": "10-19",
     "state": "ready", "rtt_ms": 1.84, "memory_bytes": 820 * MB, "peak_memory_bytes": 960 * MB,
     "free_bytes": 0, "ms_per_layer": 0.9, "share": 0.6},
    {"id": 2, "name": "desktop", "address": "192.168.1.33:40222", "device": "cuda", "layers": "20-29",
     "state": "loading", "rtt_ms": 3.2, "memory_bytes": 410 * MB, "peak_memory_bytes": 410 * MB,
     "free_bytes": 0, "ms_per_layer": 0.3, "share": 0.2},
    {"id": 4, "name": "netbook", "address": "192.168.1.52:40444", "device": "cpu", "layers": "", "state": "spare",
     "rtt_ms": 2.5, "memory_bytes": 180 * MB, "peak_memory_bytes": 180 * MB, "free_bytes": 0, "ms_per_layer": 7.4,
     "share": 0.0, "spare": True},
    {"id": 3, "name": "old-pc", "address": "192.168.1.40:40333", "device": "cpu", "layers": "", "state": "lost",
     "rtt_ms": None, "memory_bytes": 0, "free_bytes": 0},
]
INVITE = "sfchat join 192.168.1.10:7340 --token s3cr3t-t0ken-42"
MESSAGES = [
    {"role": "user", "content": "Write a haiku about a ring of computers."},
    {"role": "assistant", "content": "Layers pass the torch,\nhidden states from hand to hand —\n"
                                     "one mind, many hosts.\n\n*Written by the **ring**.*"},
    {"role": "user", "content": "And in Python?"},
    {"role": "assistant", "content": "```python\nfor peer in ring:\n    x = peer.forward(x)\n```"},
]


def round_event(i: int) -> dict:
    tps = 20 + 12 * ((i * 7) % 5) / 4
    return {"event": "round", "new": [1],
            "round": {"k": 4, "drafted": 4, "accepted": 3, "committed": 4, "draft_ms": 3.2, "hidden_draft_ms": 2.0,
                      "network_ms": 12.5, "host_ms": 40.1, "peers": [["laptop", 55.0], ["desktop", 31.5]],
                      "verify_ms": 0.8, "round_ms": 143.1, "in_flight": 2, "cancelled": False, "caught": i % 8 == 0},
            "stats": {"tokens": 4 * i, "seconds": 1.0, "tokens_per_second": 24.6, "tokens_per_second_now": tps,
                      "tokens_per_second_peak": 32.0, "rounds": i, "tokens_per_round": 3.25, "drafted": 4 * i,
                      "accepted": 3 * i, "acceptance": 0.75, "rounds_in_flight": 1.85, "cancelled_share": 0.1,
                      "hedges_caught": i // 8}}


def host_app(messages: list[dict] = MESSAGES) -> HostApp:
    args = parser().parse_args(["host", "--model", "smollm2-135m"])
    conv = store.Conversation(id="snapshot", messages=[dict(m) for m in messages])
    return HostApp(ring_options(args, settings.load()), settings.load(), conv, start_engine=False)


async def fill_host(pilot) -> None:
    await pilot.pause()
    scr = pilot.app.main_screen
    scr.query_one(PromptInput).cursor_blink = False  # a blinking cursor is caught on or off by chance
    scr.post_message(RingChanged(MEMBERS, INVITE))
    scr.post_message(Ready("smollm2-135m", "ngram"))
    stats = scr.query_one(StatsPanel)
    for i in range(1, 41):
        stats.add_round(round_event(i))
    stats.flush()
    table = scr.query_one(RingPanel).query_one(DataTable)
    await until(pilot, lambda: scr.ready and table.row_count == len(MEMBERS) and scr.query_one(RingPanel).invite,
                "the ring and the model shown", 10)
    # the table's columns widen with their rows, and the panel lays out again after them: wait until it settles
    shown = None
    while shown != (table.virtual_size, table.size):
        shown = (table.virtual_size, table.size)
        await pilot.pause(0.1)


def test_host_screen(snap_compare):
    assert snap_compare(host_app(), terminal_size=SIZE, run_before=fill_host)


def test_help_screen(snap_compare):
    assert snap_compare(host_app(), terminal_size=SIZE, run_before=fill_host, press=["f1"])


def test_stats_legend_screen(snap_compare):
    assert snap_compare(host_app(), terminal_size=SIZE, run_before=fill_host, press=["f2"])


def test_peer_screen(snap_compare):
    args = parser().parse_args(["join", "192.168.1.10:7340", "--token", "s3cr3t", "--name", "laptop"])
    state = PeerState(state="ready", span=Span(10, 20, 30), device="cpu", rss=820 * MB, peak=960 * MB, sessions=2, frames=314,
                      compute_ms=[50 + (i * 37) % 23 for i in range(60)], next_hop="192.168.1.33:40222",
                      host="192.168.1.10:7340")

    async def fill(pilot) -> None:
        scr = pilot.app.main_screen
        scr.post_message(PeerChanged(state))
        for line in ("12:00:01 INFO joined 192.168.1.10:7340 as 1; data port 40111",
                     "12:00:04 INFO loaded layers 10-19 in 2.31 s"):
            scr.post_message(LogLine(logging.INFO, line))
        log = scr.query_one(Log)
        await until(pilot, lambda: scr.state is state and len(log.lines) == 2, "the state and the log shown", 10)

    assert snap_compare(PeerApp(join_options(args), start_engine=False), terminal_size=SIZE, run_before=fill)


async def fill_narrow(pilot) -> None:
    await fill_host(pilot)
    table = pilot.app.main_screen.query_one(RingPanel).query_one(DataTable)
    # the state column shown whole, no horizontal scroll bar's blocks: the invite's note went under the table
    def state_shown() -> bool:
        widths = [c.get_render_width(table) for c in table.ordered_columns]
        return sum(widths[: COLUMNS.index("state") + 1]) <= table.size.width

    await until(pilot, state_shown, "the state column", 10)
    assert not table.show_horizontal_scrollbar


def test_host_screen_at_100_by_30(snap_compare):
    assert snap_compare(host_app(), terminal_size=(100, 30), run_before=fill_narrow)


def test_an_answer_keeps_its_single_line_breaks():
    """A haiku or a list of lines shows as lines, as the saved chat has them (Markdown alone joins them into one
    paragraph), also while it streams in."""
    from textual.widgets._markdown import MarkdownParagraph

    from sfchat.tui.widgets.conversation import Conversation

    async def main():
        app = host_app()
        async with app.run_test(size=SIZE) as pilot:
            await fill_host(pilot)
            shown = [str(p._content) for p in pilot.app.main_screen.query(MarkdownParagraph)]
            assert "Layers pass the torch,\nhidden states from hand to hand —\none mind, many hosts." in shown
            msg = await pilot.app.main_screen.query_one(Conversation).add("assistant")
            msg.start_stream()
            for piece in ("one\ntw", "o\nthree"):
                msg.feed(piece)
                await pilot.pause(0.1)
            await msg.end_stream()
            assert [str(p._content) for p in msg.query(MarkdownParagraph)] == ["one\ntwo\nthree"]

    asyncio.run(main())


def test_an_answer_markdown_would_swallow_still_shows():
    """SmolLM2 counting ("1. 1. 2. 3. 4.") is, to Markdown, lists nested in lists down to an empty item, which
    showed as an empty answer box: its text shows, reopened from a saved chat and while it streams in, and an
    ordinary list still shows as a list."""
    from textual.widgets._markdown import MarkdownOrderedList

    from sfchat.tui.widgets.conversation import ChatMessage, Conversation

    counting = "1. 1. 2. 3. 4."
    listed = "Steps:\n\n1. one\n2. two"

    def shown(app, widget) -> list[str]:
        """The lines the screen shows inside the widget's border."""
        r = widget.region
        assert r.bottom <= app.size.height, r  # (all of it on the screen)
        strips = app.screen._compositor.render_strips()[r.y + 1:r.bottom - 1]
        return [s.crop(r.x + 1, r.right - 1).text.strip("│ ") for s in strips]

    async def main():
        app = host_app([{"role": "user", "content": "Count from 1 to 100"}, {"role": "assistant", "content": counting}])
        async with app.run_test(size=SIZE) as pilot:
            await fill_host(pilot)
            conv = pilot.app.main_screen.query_one(Conversation)
            saved = conv.query(ChatMessage)[-1]
            assert saved.source == counting and shown(app, saved) == [counting]
            await conv.remove_children()
            for text in (counting, listed):
                msg = await conv.add("assistant")
                msg.start_stream()
                for piece in re.findall(r"\S+\s*|\s+", text):
                    msg.feed(piece)
                    await pilot.pause(0.06)
                await msg.end_stream()
                await pilot.pause(0.1)
                assert msg.source == text
                got = shown(app, msg)
                if text == counting:
                    assert got == [counting]
                else:  # (a list's own numbers are drawn by Textual: the items show as a list does)
                    assert got == ["Steps:", "", "1. one", "2. two"] and len(msg.query(MarkdownOrderedList)) == 1

    asyncio.run(main())
