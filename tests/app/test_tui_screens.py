"""The host's screen without a ring (the real app fed the engine's messages): the invite and what Ctrl+T copies,
the stats legend and the help, and the commands that need no ring."""
from __future__ import annotations

import asyncio
import html
import re
import shutil
import subprocess

import pytest

from sfchat import settings, store
from sfchat.cli import parser
from sfchat.options import ring_options
from sfchat.tui.app import HostApp
from sfchat.tui.messages import Ready, RingChanged
from sfchat.tui.screens.legend import LegendScreen
from sfchat.tui.widgets.ring import InviteCommand
from sfchat.tui.widgets.stats import LEGEND

FP = "12f78aaf1e1ca972" * 4  # a TLS fingerprint: 64 hex characters
COMMAND = f"sfchat join 192.168.1.10:7340 --token s3cr3t-t0ken-42 --tls {FP}"
MEMBERS = [{"id": 0, "name": "host", "address": "192.168.1.10:7340", "device": "cpu", "layers": "0-29",
            "state": "ready", "rtt_ms": 0.0, "memory_bytes": 2**30, "peak_memory_bytes": 2**30, "free_bytes": 0}]


def host_app() -> HostApp:
    args = parser().parse_args(["host", "--model", "smollm2-135m", "--temperature", "0.3"])
    return HostApp(ring_options(args, settings.load()), settings.load(), store.Conversation(), start_engine=False)


def screen_text(app) -> str:
    """What the screen shows, as the text of its SVG screenshot."""
    return html.unescape(app.export_screenshot()).replace("\xa0", " ")


def notices(app) -> list[str]:
    return [n.message for n in app._notifications]


def run(app, size, steps) -> None:
    async def main():
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            app.main_screen.post_message(RingChanged(MEMBERS, f"{COMMAND}\n(this machine is also at 10.0.0.5:7340)"))
            app.main_screen.post_message(Ready("smollm2-135m", "ngram"))
            await pilot.pause()
            await steps(pilot)

    asyncio.run(main())


@pytest.fixture
def private_tmux(tmp_path, monkeypatch):
    """A tmux server of this test's own, named by $TMUX as it is for a program running inside tmux."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    sock = tmp_path / "tmux.sock"
    subprocess.run(["tmux", "-S", str(sock), "new-session", "-d", "-s", "t"], check=True)
    monkeypatch.setenv("TMUX", f"{sock},0,0")
    yield sock
    subprocess.run(["tmux", "-S", str(sock), "kill-server"], check=False)


def test_the_invite_stays_on_one_line_and_ctrl_t_copies_it_whole_into_tmux(private_tmux):
    app = host_app()

    async def steps(pilot):
        line = app.main_screen.query_one(InviteCommand)
        assert line.render().plain == COMMAND and line.size.height == 1  # whole, on one line, at 140 columns
        await pilot.press("ctrl+t")
        assert app.clipboard == COMMAND  # the terminal was asked too (OSC 52), the notes under it not copied
        assert notices(app)[-1] == "Copied the invite command to tmux's paste buffer (prefix, then ] pastes it)."
        await pilot.resize_terminal(100, 40)
        await pilot.pause()
        shown = line.render().plain  # too narrow for the fingerprint: its ends, on one line still
        assert shown.endswith(f"--tls {FP[:8]}…{FP[-8:]}") and len(shown) <= line.size.width

    run(app, (140, 42), steps)
    pasted = subprocess.run(["tmux", "-S", str(private_tmux), "show-buffer"], capture_output=True, text=True)
    assert pasted.stdout == COMMAND


def test_without_tmux_or_a_clipboard_tool_the_copy_says_it_only_asked_the_terminal(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # no xclip, wl-copy, …
    app = host_app()

    async def steps(pilot):
        await pilot.press("ctrl+t")
        assert app.clipboard == COMMAND
        assert notices(app)[-1] == ("Copied the invite command to the terminal's clipboard (OSC 52), if your "
                                    "terminal lets apps set it.")

    run(app, (140, 42), steps)


def test_f2_and_help_explain_every_row_of_the_stats_panel_and_help_is_never_cut():
    app = host_app()

    async def steps(pilot):
        await pilot.press("f2")
        assert isinstance(app.screen, LegendScreen)
        legend = screen_text(app)
        for label, meaning in LEGEND:
            assert label.strip().split()[0] in legend and meaning.split()[0] in legend
        for label in ("in flight", "cancelled", "hedges caught"):  # the rows of rounds in flight, explained too
            assert re.search(f">{label} *</text>", legend), label  # a cell of the legend's labels
        await pilot.press("escape", "f1")
        help_text = screen_text(app)
        assert "F2 explains the stats panel" in help_text
        assert "a hub id ORG/NAME" in help_text  # the /draft line wraps: its end is on screen
        await pilot.press("f2")  # from the help to the legend
        assert isinstance(app.screen, LegendScreen)

    run(app, (160, 45), steps)


def test_k_and_temp_alone_show_the_values_and_save_names_the_users_path(tmp_path):
    app = host_app()

    async def steps(pilot):
        for line, says in (("/k", "K is auto: it adapts (/k N pins it, /k auto lets it adapt)"),
                           ("/temp", "The temperature is 0.3 (/temp T changes it, 0 = greedy)")):
            await pilot.press(*line, "enter")
            assert notices(app)[-1] == says
        await pilot.press(*"/k 3", "enter", *"/k", "enter")
        assert notices(app)[-1].startswith("K is 3, pinned")
        await pilot.press(*"/save /nonexistent/dir/x.md", "enter")
        assert notices(app)[-1] == "Cannot write /nonexistent/dir/x.md: there is no folder /nonexistent/dir"
        await pilot.press(*f"/save {tmp_path}", "enter")  # a folder, not a file
        assert notices(app)[-1] == f"Cannot write {tmp_path}: Is a directory"
        assert not list(tmp_path.glob(".*.tmp"))

    run(app, (140, 42), steps)
