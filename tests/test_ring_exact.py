"""Greedy output through rings of real peer processes equals plain transformers on the same weights."""
import pytest
import torch
import trio
from transformers import AutoModelForCausalLM

from helpers import ask_json, reference_ids
from peers.host import Host
from sfchat.local import LocalPeers


@pytest.mark.parametrize("arch,peers", [("llama", 1), ("llama", 3), ("qwen2", 2)])
def test_greedy_ids_match_transformers(arch, peers, tiny_llama, tiny_qwen2):
    model = tiny_llama if arch == "llama" else tiny_qwen2
    prompt = "hello world, the quick brown fox"
    want = reference_ids(model, prompt, 24)
    got = ask_json(prompt, "--model", str(model), "--local-peers", str(peers), "--max-new-tokens", "24",
                   "--draft", "none")
    assert got["token_ids"] == want
    members = got["stats"]["members"]
    assert len(members) == peers + 1 and all(m["layers"] for m in members)


def test_logits_match_through_three_processes(tiny_qwen2):
    """Last-position logits after prefill and after several decode steps, host + 2 peer processes."""
    ref = AutoModelForCausalLM.from_pretrained(tiny_qwen2, dtype=torch.float32)
    prompt = [5, 17, 42, 99, 7, 3, 250, 11]

    async def main():
        host = Host(str(tiny_qwen2), say=lambda *a: None)
        async with trio.open_nursery() as nursery:
            await nursery.start(host.serve)
            with LocalPeers(2, host.address, host.token, model=str(tiny_qwen2)) as lp:
                await host.wait_members(2, timeout=120)
                await host.replan()
                assert [m.span.size for m in host.ring] == [2, 2] or sum(m.span.size for m in host.ring) >= 3
                rs = host.new_session("s1")
                tokens = list(prompt)
                for step in range(6):
                    logits, timing = await host.forward(rs, tokens, [])
                    with torch.no_grad():
                        want = ref(torch.tensor([tokens])).logits[0, -1]
                    torch.testing.assert_close(logits[-1], want, atol=1e-4, rtol=1e-4)
                    assert len(timing["peers"]) == 2
                    tokens.append(int(want.argmax()))
                    rs.ring_len = len(tokens) - 1
                # a repeated pass with the same committed length is harmless (the trim rule)
                rs.ring_len -= 3
                logits, _ = await host.forward(rs, tokens, [])
                with torch.no_grad():
                    want = ref(torch.tensor([tokens])).logits[0, -1]
                torch.testing.assert_close(logits[-1], want, atol=1e-4, rtol=1e-4)
                await host.close()
            nursery.cancel_scope.cancel()

    trio.run(main)
