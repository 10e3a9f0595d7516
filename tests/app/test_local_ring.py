"""`--local-peers N` is a ring the user asked for: its processes hold layers under the default placement, even
where the host alone would be faster (each would be a spare by speed alone). Real processes, `sfchat ask --json`
(tests/unit/plan/test_placement.py has the split itself)."""
from helpers import ask_json

# the host far the fastest: by speed alone it holds every layer and both local peers are spares
SPEEDS = "host=1,local-a=1000,local-b=1000"


def layers_of(got: dict) -> dict[str, str]:
    return {m["name"]: m["layers"] for m in got["stats"]["members"]}


def test_local_peers_hold_layers_by_default(tiny_llama, monkeypatch):
    monkeypatch.delenv("SFCHAT_PLACEMENT", raising=False)  # the default: speed
    monkeypatch.setenv("SFCHAT_TEST_MS_PER_LAYER", SPEEDS)
    args = ("hello", "--model", str(tiny_llama), "--local-peers", "2", "--max-new-tokens", "4", "--draft", "none",
            "--temperature", "0")
    held = layers_of(ask_json(*args))
    assert all(held[name] not in ("", "none") for name in ("host", "local-a", "local-b")), held
