"""Model resolution: clear one-line errors; a hub id already in the Hugging Face cache runs offline."""
import os
import shlex
import sys

from helpers import reference_ids, sfchat


def test_offline_with_nothing_cached_names_sfchat_pull(tmp_path, monkeypatch):
    """The hint is runnable as printed: with no `sfchat` on PATH it names the command that ran it."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("SFCHAT_MODELS_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip cannot reach any index: offline
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    p = sfchat("ask", "hi", check=False)
    assert p.returncode == 1
    last = p.stderr.strip().splitlines()[-1]
    assert f"`{shlex.quote(sys.executable)} -P -m sfchat pull`" in last and last.startswith("sfchat ask:"), p.stderr


def test_missing_model_is_one_clear_line(tmp_path):
    p = sfchat("ask", "hi", "--model", str(tmp_path / "nope"), check=False)
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == [p.stderr.strip().splitlines()[-1]]
    assert "hub id ORG/NAME" in p.stderr


def test_hub_id_in_the_local_cache_is_found(tiny_llama, tmp_path, monkeypatch):
    """A snapshot another tool left in the cache runs with HF_HUB_OFFLINE=1 (tests/app/test_hub.py fetches them)."""
    commit = "c0ffee" * 6 + "c0ff"
    root = tmp_path / "hub" / "models--acme--tiny"
    (root / "snapshots").mkdir(parents=True)
    os.symlink(tiny_llama, root / "snapshots" / commit)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from helpers import ask_json
    got = ask_json("hello", "--model", "acme/tiny", "--max-new-tokens", "4", "--draft", "none", "--temperature", "0")
    assert got["token_ids"] == reference_ids(tiny_llama, "hello", 4)  # the cached snapshot is the model that ran
