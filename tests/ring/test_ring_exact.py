"""Greedy output through rings of real peer processes equals plain transformers on the same weights."""
import pytest
import torch
import trio
from transformers import AutoModelForCausalLM

from helpers import check_logits_follow, reference_ids, running_ring
from shared_ring import ask_in_process


# (Qwen2 and the other architectures through a host and two peer processes: tests/ring/test_architectures.py)
@pytest.mark.parametrize("peers", [1, 3])
def test_greedy_ids_match_transformers(peers, tiny_llama):
    prompt = "hello world, the quick brown fox"
    want = reference_ids(tiny_llama, prompt, 24)
    got = ask_in_process(prompt, "--model", str(tiny_llama), "--local-peers", str(peers), "--max-new-tokens",
                         "24", "--draft", "none")
    assert got["token_ids"] == want
    members = got["stats"]["members"]
    assert len(members) == peers + 1 and all(m["layers"] for m in members)


def test_logits_match_through_three_processes(tiny_qwen2):
    """Last-position logits after prefill and after several decode steps, host + 2 peer processes."""
    ref = AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32)
    prompt = [5, 17, 42, 99, 7, 3, 250, 11]

    async def main():
        async with running_ring(tiny_qwen2, 2) as (host, _):
            assert len(host.ring) == 2 and all(m.span.size for m in host.ring)
            await check_logits_follow(host, ref, prompt, 6)

    trio.run(main)


def test_a_sliding_window_model_rolls_back_exactly(sliding_qwen2, tiny_qwen2):
    """Qwen2 with sliding-window layers (a window of 4, far shorter than the conversation): those layers' caches
    keep only the window, yet the drafts the target rejects roll back and every mask fits. The draft is another
    tiny model, so most of its drafts are rejected."""
    prompt = "hello world, the quick brown fox"
    want = reference_ids(sliding_qwen2, prompt, 32)
    got = ask_in_process(prompt, "--model", str(sliding_qwen2), "--local-peers", "1", "--max-new-tokens", "32",
                         "--draft", str(tiny_qwen2), "--k", "3")
    assert got["token_ids"] == want
    assert got["stats"]["accepted"] < got["stats"]["drafted"]  # rejected drafts: rolled back
