"""The real host app, driven by Textual's pilot, on a real ring of tiny models (a local peer process each)."""
from __future__ import annotations

import asyncio
import io
import json
import re
import shutil
import statistics
import os
import signal
import time

import pytest
from rich.console import Console
from transformers import AutoTokenizer

from sfchat import settings, store
from sfchat.tui.screens.history import HistoryScreen
from sfchat.tui.widgets.conversation import ChatMessage
from sfchat.tui.widgets.prompt import PromptInput
from sfchat.tui.widgets.ring import RingPanel
from sfchat.tui.widgets.stats import StatsPanel
from textual import events
from textual.widgets import DataTable, Static

from apps import SIZE, ask, host_app
from helpers import reference_ids, until

async def ready(app, pilot) -> None:
    await until(pilot, lambda: app.main_screen.ready, "the ring")
    table = app.main_screen.query_one(RingPanel).query_one(DataTable)
    await until(pilot, lambda: table.row_count == 2, "two members in the ring panel")


async def echo_ms(app, prompt: PromptInput, ch: str) -> float:
    """Milliseconds from a key arriving (as the terminal driver posts it) to the prompt line holding it."""
    n = len(prompt.value)
    t0 = time.perf_counter()
    app.post_message(events.Key(ch, ch))
    while len(prompt.value) == n:
        await asyncio.sleep(0.0005)
    await asyncio.sleep(0.02)  # a person types at most ~50 keys a second
    return (time.perf_counter() - t0 - 0.02) * 1e3


def reference_text(model, chat, n: int) -> str:
    """What plain transformers answers, greedy, to `chat` (a prompt or the messages so far), as the screen shows it."""
    return AutoTokenizer.from_pretrained(model).decode(reference_ids(model, chat, n), skip_special_tokens=True)


def text_of(widget: Static) -> str:
    """What a Static shows, as plain text (the panels hold Rich tables)."""
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(widget.content)
    return console.export_text()


def test_prompt_answer_stats_commands_and_quit(tiny_llama):
    app = host_app(tiny_llama, "--max-new-tokens", "24", "--temperature", "0", "--in-flight", "2")
    want = reference_text(tiny_llama, "hello world", 24)

    async def main():
        async with app.run_test(size=SIZE) as pilot:
            await ready(app, pilot)
            scr = app.main_screen
            ring = [row for row in scr.query_one(RingPanel).query_one(DataTable).rows]
            assert ring == ["0", "1"]
            assert " join 127.0.0.1:" in scr.query_one(RingPanel).invite
            # members in pass order, by their layers, whatever order they joined in
            panel, members = scr.query_one(RingPanel), app.engine.host.members_info()
            panel.show(members[::-1], panel.invite)
            assert [row.value for row in panel.query_one(DataTable).rows] == ["0", "1"]

            answer = await ask(app, pilot, "hello world")
            assert answer.source == want and scr.conv.messages[-1]["content"] == want
            assert [m["role"] for m in scr.conv.messages] == ["user", "assistant"]
            # cut by --max-new-tokens (the tiny model never ends on its own): the status line says so
            status = str(scr.query_one("#status", Static).content)
            assert status == "ready; the answer was cut: it reached --max-new-tokens (24)", status
            stats = scr.query_one(StatsPanel)
            rounds = text_of(stats.query_one("#rounds", Static))
            assert "the last answer" in rounds and "tokens/round" in rounds and " last" in rounds
            assert "trip" not in rounds and "verify" not in rounds  # one name per figure; checking is the host's
            assert rounds.count("K") == 1 and " avg, " in rounds  # measured K; the setting is apart
            # rounds in flight (--in-flight 2 reached the policy), the share cancelled, the hedges that caught
            s, r = stats.latest["stats"], stats.latest["round"]
            assert app.engine.policy.in_flight == 2
            for line in (f"in flight +{s['rounds_in_flight']:.1f} avg, {r['in_flight']} last",
                         f"cancelled +{100 * s['cancelled_share']:.0f}% of rounds", f"hedges caught +{s['hedges_caught']}"):
                assert re.search(rf"^{line} *$", rounds, re.M), rounds
            speed = text_of(stats.query_one("#speed", Static)).splitlines()
            now, avg, peak = speed[1].split()[1:]
            assert now == "—" and float(avg) > 0 and float(peak) > 0  # "now" ends with the answer
            assert "1 answer, " in text_of(stats.query_one("#session", Static))
            assert scr.query_one(StatsPanel).history  # the sparkline's data

            # saved as it grows, atomically, in the private data dir
            saved = store.load(scr.conv.id)
            assert saved.messages == scr.conv.messages
            assert saved.model == tiny_llama.name  # the model's name, as the ring loaded it (issue 48: "")

            # the commands change the settings file and what the panel shows
            await pilot.press(*"/temp 0.3", "enter")
            await pilot.press(*"/k 2", "enter")
            await pilot.press(*"/draft off", "enter")
            await until(pilot, lambda: settings.load().draft == "none", "the engine to take the draft")
            s = settings.load()
            assert (s.temperature, s.k, s.draft) == (0.3, "2", "none")
            assert (scr.answer.temperature, scr.answer.k, scr.answer.draft) == (0.3, 2, "none")
            shown = text_of(scr.query_one(StatsPanel).query_one("#settings", Static))
            assert "0.3" in shown and "K setting" in shown and "2 (pinned)" in shown

            # multi-turn through the chat template, with the new settings
            await ask(app, pilot, "and again")
            assert [m["role"] for m in scr.conv.messages] == ["user", "assistant"] * 2
            assert "none" in text_of(scr.query_one(StatsPanel).query_one("#settings", Static))

            # the prompt history walks back through what was typed
            prompt = scr.query_one(PromptInput)
            await pilot.press("up")
            assert prompt.value == "and again"
            await pilot.press("up")
            assert prompt.value == "/draft off"
            await pilot.press("down", "down")
            assert prompt.value == ""

            await pilot.press("ctrl+y")
            assert app.clipboard == scr.conv.messages[-1]["content"]

            await pilot.press(*"/new", "enter")
            assert scr.conv.messages == [] and not list(scr.query(ChatMessage))
            await ask(app, pilot, "fresh start")
            assert len(scr.conv.messages) == 2 and len(store.list_chats()) == 2

            procs = app.engine.ring.local.procs
            await pilot.press("ctrl+q")
            await until(pilot, lambda: not app.engine.thread.is_alive(), "the engine to stop", 30)
            assert all(p.poll() is not None for p in procs)  # every process the app started is gone

    asyncio.run(main())


@pytest.fixture(scope="module")
def long_llama(tiny_llama, tmp_path_factory):
    """The tiny Llama with room for 4096 positions: greedy, it answers ~1700 tokens before it ends its turn."""
    path = tmp_path_factory.mktemp("long") / "long-llama"
    shutil.copytree(tiny_llama, path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 4096}))
    return path


@pytest.mark.serial  # times the key echo
def test_escape_stops_a_long_answer_and_keys_echo_fast(long_llama):
    """Keys typed while the ring generates flat out (no pause between its rounds) reach the prompt line at once;
    Escape stops the answer and keeps what came."""
    app = host_app(long_llama, "--max-new-tokens", "1500", "--draft", "none", "--temperature", "0")

    async def main():
        async with app.run_test(size=SIZE) as pilot:
            await ready(app, pilot)
            scr = app.main_screen
            stats = scr.query_one(StatsPanel)
            await pilot.press(*"hello world", "enter")  # greedy, seconds of rounds back to back
            await until(pilot, lambda: len(stats.history) >= 5, "the first rounds")
            # while the ring generates, a key press reaches the prompt line quickly
            prompt = scr.query_one(PromptInput)
            delays = [await echo_ms(app, prompt, ch) for ch in "typing while it streams"]
            assert scr.answering, "the answer finished before the keys were measured"
            print(f"\nkey echo while generating: median {statistics.median(delays):.1f} ms, max {max(delays):.1f} ms")
            assert statistics.median(delays) < 50
            await pilot.press("escape")
            await until(pilot, lambda: not scr.answering, "the answer to stop")
            answer = list(scr.query(ChatMessage))[-1]
            assert answer.border_subtitle == "stopped"
            assert len(app.engine.chat.tokens) < 1500  # the prompt and the answer so far: it stopped early
            assert scr.conv.messages[-1] == {"role": "assistant", "content": answer.source}
            assert store.load(scr.conv.id).messages == scr.conv.messages
            assert prompt.value == "typing while it streams"  # what was typed meanwhile is still there
            await app.action_quit()

    asyncio.run(main())


def test_saved_chats_reopen(tiny_llama):
    older = store.Conversation(messages=[{"role": "user", "content": "older question"},
                                         {"role": "assistant", "content": "older *answer*"}], temperature=0.0)
    store.save(older)
    newer = store.Conversation(messages=[{"role": "user", "content": "newer question"},
                                         {"role": "assistant", "content": "newer answer"}])
    store.save(newer)
    # `sfchat host --resume` reopens the latest one
    app = host_app(tiny_llama, "--max-new-tokens", "12", "--temperature", "0.5", conv=store.resume("last"))
    want = reference_text(tiny_llama, older.messages + [{"role": "user", "content": "follow up"}], 12)

    async def main():
        async with app.run_test(size=SIZE) as pilot:
            scr = app.main_screen
            await pilot.pause()
            assert [m.source for m in scr.query(ChatMessage)] == ["newer question", "newer answer"]
            await ready(app, pilot)
            # the chats screen lists both, newest first; choosing the older one shows and continues it
            await pilot.press("ctrl+o")
            assert isinstance(app.screen, HistoryScreen)
            await pilot.press("down", "enter")
            await until(pilot, lambda: scr.conv.id == older.id, "the older chat")
            assert [m.source for m in scr.query(ChatMessage)] == ["older question", "older *answer*"]
            assert scr.answer.temperature == 0.0  # the chat's own temperature comes back with it
            answer = await ask(app, pilot, "follow up")
            assert answer.source == want and answer.border_subtitle != "failed"  # the whole chat went in
            again = store.load(older.id)
            assert [m["content"] for m in again.messages][:3] == ["older question", "older *answer*", "follow up"]
            assert len(again.messages) == 4 and len(store.load(newer.id).messages) == 2
            await app.action_quit()

    asyncio.run(main())


def test_a_ring_that_cannot_start_says_why_and_quits(tmp_path):
    app = host_app(tmp_path / "no-such-model")

    async def main():
        async with app.run_test(size=SIZE) as pilot:
            status = app.main_screen.query_one("#status", Static)
            await until(pilot, lambda: "the ring stopped" in str(status.content), "the error", 30)
            assert "no-such-model" in str(status.content)
            await pilot.press("ctrl+q")
            await until(pilot, lambda: not app.engine.thread.is_alive(), "the engine thread to end", 10)

    asyncio.run(main())
    assert app.return_code == 1 and "no-such-model" in app.fatal  # a fatal error exits non-zero, after showing it


def notices(app) -> list[str]:
    return [n.message for n in app._notifications]


def test_slash_commands_refuse_bad_arguments_in_one_line_and_save_nothing_broken(tiny_llama, tmp_path, monkeypatch):
    app = host_app(tiny_llama, "--max-new-tokens", "6", "--draft", "none", "--temperature", "0")
    not_a_model = tmp_path / "empty-dir"
    not_a_model.mkdir()

    async def main():
        async with app.run_test(size=SIZE) as pilot:
            await ready(app, pilot)
            before, before_file = settings.load(), settings.path().read_bytes() if settings.path().exists() else None
            for line, says in (("/k abc", "/k: K must be auto or a whole number 0..32, got 'abc'"),
                               ("/k 99", "/k: K must be auto or 0..32"),
                               ("/temp abc", "/temp: temperature must be a number in 0..5, got 'abc'"),
                               ("/temp -1", "/temp: temperature must be in 0..5"),
                               ("/draft", "/draft: which drafter? auto (on), none (off), ngram or a model"),
                               ("/draft /nonexistent", "/draft: no draft model '/nonexistent'"),
                               ("/frobnicate", "unknown command /frobnicate; /help lists them")):
                await pilot.press(*line, "enter")
                await until(pilot, lambda: any(says in n for n in notices(app)), f"the message for {line}", 10)
                shown = next(n for n in notices(app) if says in n)
                assert "\n" not in shown and "Traceback" not in shown and "invalid literal" not in shown
            # a path that exists but holds no model: the engine tries it, says why, and nothing is saved
            await pilot.press(*f"/draft {not_a_model}", "enter")
            await until(pilot, lambda: any("(not saved)" in n for n in notices(app)), "the draft's refusal")
            assert settings.load() == before  # nothing saved: the file is as it was
            assert (settings.path().read_bytes() if settings.path().exists() else None) == before_file
            assert app.main_screen.answer.draft == "none"  # still the working one
            # a hub model while the hub is out of reach: one line at once, not half a minute of retries
            from huggingface_hub import constants
            monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
            monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
            await pilot.press(*"/draft acme/nothing", "enter")
            await until(pilot, lambda: any("/draft acme/nothing:" in n for n in notices(app)), "the hub's refusal")
            shown = next(n for n in notices(app) if "/draft acme/nothing:" in n)
            assert "out of reach" in shown and "(not saved)" in shown
            assert not any("Retry" in n for n in notices(app)), notices(app)
            answer = await ask(app, pilot, "hello world")  # and the next answer works
            assert answer.border_subtitle.startswith("length limit (6 tokens)")
            assert "--max-new-tokens" in answer.border_subtitle

    asyncio.run(main())


def test_a_chat_past_the_context_drops_its_oldest_messages_and_says_so(tiny_llama):
    app = host_app(tiny_llama, "--max-new-tokens", "4", "--draft", "none", "--temperature", "0")
    long = " ".join(["the quick brown fox jumps over the lazy dog"] * 6)  # ~190 of the tiny model's 512 positions

    async def main():
        async with app.run_test(size=SIZE) as pilot:
            await ready(app, pilot)
            scr = app.main_screen
            status = scr.query_one("#status", Static)
            for _ in range(3):
                scr.query_one(PromptInput).value = long
                await pilot.press("enter")
                await until(pilot, lambda: not scr.answering, "the answer")
            assert "dropped the 2 oldest message(s)" in str(status.content)
            assert len(scr.conv.messages) == 6  # the chat itself keeps every message
            # one prompt alone past the context is refused in one line; the chat is as it was
            scr.query_one(PromptInput).value = long * 3
            await pilot.press("enter")
            await until(pilot, lambda: not scr.answering, "the refusal")
            assert "the answer failed: the prompt is" in str(status.content) and "512" in str(status.content)
            assert len(scr.conv.messages) == 6

    asyncio.run(main())


def test_the_ring_panel_shows_a_lost_member_until_the_ring_is_re_planned(tiny_llama):
    """A local peer killed: the host that started it reaps it (no <defunct>) and starts it again, saying so; its
    row shows it lost, then ready again under its old number (one row, never a second one beside a lost one); the
    host's row and the invite name the --advertise address."""
    app = host_app(tiny_llama, "--advertise", "chat.example.org", "--draft", "none")

    async def main():
        async with app.run_test(size=SIZE) as pilot:
            await ready(app, pilot)
            panel = app.main_screen.query_one(RingPanel)
            table = panel.query_one(DataTable)
            rows = lambda: {key.value: str(table.get_cell(key, "state")) for key in table.rows}  # noqa: E731
            host, local = app.engine.host, app.engine.ring.local
            (victim,) = local.procs
            assert rows() == {"0": "ready", "1": "ready"}
            said = []
            host.say = lambda *a, say=host.say: said.append(" ".join(map(str, a))) or say(*a)
            os.kill(victim.pid, signal.SIGKILL)  # (not victim.kill(): that would not leave reaping to the host)
            seen = []
            await until(pilot, lambda: seen.append(rows()) or rows() == {"0": "ready", "1": "lost"},
                        "the member shown lost", 30)
            await until(pilot, lambda: seen.append(rows()) or rows() == {"0": "ready", "1": "ready"},
                        "the ring re-planned with the member started again", 60)
            assert all(set(r) == {"0", "1"} for r in seen), seen  # its own row throughout
            assert victim.returncode == -signal.SIGKILL and not os.path.exists(f"/proc/{victim.pid}")  # reaped
            assert local.procs[0].pid != victim.pid and local.procs[0].poll() is None
            assert any(f"local peer local-a (pid {victim.pid}) exited with -9; restarted it as pid "
                       f"{local.procs[0].pid}" in line for line in said), said
            assert table.get_cell("0", "address") == f"chat.example.org:{host.port}"
            assert f" join chat.example.org:{host.port} --token {host.token}" in panel.invite
            await app.action_quit()

    asyncio.run(main())
