"""Saved chats, the settings file, the typed commands: the parts of the TUI that need no terminal."""
import os

import pytest

from sfchat import settings, store
from sfchat.cli import main, parser
from sfchat.tui import commands


def test_chats_save_atomically_list_newest_first_and_reopen(tmp_path):
    a = store.Conversation(messages=[{"role": "user", "content": "first [chat]"}], temperature=0.2)
    path = store.save(a)
    assert path.parent == tmp_path / "data" / "chats"  # the tests' private data dir, never the user's
    b = store.Conversation(messages=[{"role": "user", "content": "second"}, {"role": "assistant", "content": "ok"}])
    store.save(b)
    a.messages.append({"role": "assistant", "content": "answer"})
    store.save(a)  # rewritten in place as it grows
    assert [c.id for c in store.list_chats()] == [a.id, b.id]
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp file left behind
    again = store.load(a.id)
    assert again.messages == a.messages and again.temperature == 0.2 and again.title == "first [chat]"
    assert store.resume("last").id == a.id
    (path.parent / "broken.json").write_text("{not json")
    assert len(store.list_chats()) == 2  # a damaged file is skipped
    with pytest.raises(ValueError):
        store.load("nope")
    with pytest.raises(ValueError):
        store.load("../etc")


def test_resume_with_no_chats_says_so():
    with pytest.raises(ValueError, match="no saved chats"):
        store.resume("last")


def test_settings_default_round_trip_and_bad_values():
    s = settings.load()
    assert (s.temperature, s.k, s.draft, s.model) == (None, "auto", "auto", "")  # None: the model's default
    s.temperature, s.k, s.draft = 0.3, "4", "ngram"
    path = settings.save(s)
    assert settings.load() == s
    path.write_text('temperature = "hot"\nk = 99\ndraft = "none"\n')
    s = settings.load()
    assert (s.temperature, s.k, s.draft) == (None, "auto", "none")  # bad values fall back, good ones stay
    path.write_text("this is [not toml")
    assert settings.load() == settings.Settings()


def test_host_resume_names_a_chat_or_the_last():
    assert parser().parse_args(["host", "--resume"]).resume == "last"
    assert parser().parse_args(["host", "--resume", "abc"]).resume == "abc"


def test_config_prints_the_settings_path(capsys, tmp_path):
    assert main(["config"]) == 0
    path = capsys.readouterr().out.strip()
    assert path == str(tmp_path / "config" / "settings.toml") and os.path.isfile(path)


def test_commands_parse():
    assert commands.parse("/k 3").value == "3"
    assert commands.parse("/k auto").value == "auto"
    assert commands.parse("/temp 0.25").value == 0.25
    assert commands.parse("/draft off").value == "none"
    assert commands.parse("/draft on").value == "auto"
    assert commands.parse("/draft ngram").value == "ngram"
    assert commands.parse("/save").value is None
    assert commands.parse("/save out.md").value == "out.md"
    assert commands.parse("/k").value is None and commands.parse("/temp").value is None  # alone: show it
    for bad in ("/k many", "/temp -1", "/draft", "/frobnicate"):
        with pytest.raises(commands.CommandError):
            commands.parse(bad)
