"""Memory you can see: `sfchat ask --json` lists every member's memory in use and its peak."""
from helpers import ask_json


def test_ask_json_has_memory_per_member(tiny_llama):
    got = ask_json("hello world", "--model", str(tiny_llama), "--local-peers", "1", "--max-new-tokens", "4",
                   "--draft", "none")
    members = got["stats"]["members"]
    assert len(members) == 2 and members[0]["name"] == "host", members
    for m in members:
        # resident sets on a CPU: at least the Python interpreter and torch, the peak never below what is in use
        assert m["memory_bytes"] > 50 * 2**20 and m["peak_memory_bytes"] >= m["memory_bytes"], m
