"""Every architecture sfchat splits, on a tiny random model of it: greedy answers through a ring of three
processes (this host and two peer processes) equal plain transformers `generate`, without a draft, with a
draft model of the same family, and with trees of drafts; an architecture it cannot split is refused in one line
before anything loads; `--dtype auto` picks per device and every member reports its dtype."""
import json

import pytest
import trio

from helpers import cosine_to_float, greedy_reply, new_chat, reference_ids, running_ring, sfchat
from peers.speculation.adaptive import KPolicy
from peers.speculation.drafting import make_drafter
from peers.compute.memory import cpu_bf16, pick_dtype
from peers.speculation.sampling import SamplingParams
from test_tree import OracleTrees, TreePolicy
from tiny import ARCHS, make_model

PROMPT = "the quick brown fox jumps over the lazy dog"
ALL = [a for a in ARCHS if a != "llama"]  # plain Llama is tests/ring/test_ring_exact.py's


@pytest.mark.parametrize("arch", ALL)
def test_greedy_through_three_processes_equals_transformers(arch, tmp_path):
    model = make_model(tmp_path / arch, arch, layers=6, seed=11)
    draft = make_model(tmp_path / f"{arch}-draft", arch, layers=2, seed=12)
    want = reference_ids(model, PROMPT, 24)

    async def main():
        async with running_ring(model, 2) as (host, _):
            assert len(host.ring) == 2 and all(m.span.size for m in host.ring) and host.shard.span.size
            plain = await greedy_reply(host, PROMPT, 24)
            chat = new_chat(host)
            drafter = make_drafter(str(draft), host.model_dir, host.config.vocab_size, chat.tokenizer)
            _, drafted = await chat.reply(PROMPT, drafter=drafter, params=SamplingParams(), policy=KPolicy(pinned=3),
                                          max_new_tokens=24)
            chat = new_chat(host)
            ids = chat.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                                     tokenize=True)
            ids = list(ids["input_ids"] if not isinstance(ids, list) else ids)
            _, tree = await chat.reply(PROMPT, drafter=OracleTrees(ids + want), params=SamplingParams(),
                                       policy=TreePolicy(), max_new_tokens=24)
            return plain, drafted, tree
    plain, drafted, tree = trio.run(main)
    assert plain == want
    assert drafted.token_ids == want
    assert drafted.stats.accepted < drafted.stats.drafted  # another model's drafts: some were rolled back
    assert tree.token_ids == want
    assert any(rd["tree"] for rd in tree.rounds)


def test_an_architecture_sfchat_cannot_split_is_one_line_before_loading(tmp_path):
    d = tmp_path / "gpt2"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    (d / "model.safetensors").write_bytes(b"not even safetensors: refused before anything reads it")
    p = sfchat("ask", "hi", "--model", str(d), "--draft", "none", check=False)
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "cannot split gpt2" in lines[0] and "Gemma 2" in lines[0] and "Qwen3" in lines[0]


def test_dtype_auto_per_device(tmp_path, monkeypatch):
    assert pick_dtype("auto", "cpu") == "float32"  # (the suite pins it: tests/conftest.py)
    assert pick_dtype("bfloat16", "cpu") == "bfloat16"  # asked for: as given
    monkeypatch.delenv("SFCHAT_CPU_DTYPE")
    (tmp_path / "amx").write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile\n")
    (tmp_path / "avx2").write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_vnni\n")
    assert cpu_bf16(str(tmp_path / "amx")) and not cpu_bf16(str(tmp_path / "avx2"))
    assert pick_dtype("auto", "cpu") == ("bfloat16" if cpu_bf16() else "float32")  # native bfloat16: taken


def test_each_member_runs_its_own_dtype_and_says_so(tiny_qwen2):
    """The host in float32, its peer in bfloat16: hidden states convert at each hop; the stats name both."""
    async def main():
        async with running_ring(tiny_qwen2, 1, extra=["--dtype", "bfloat16"]) as (host, _):
            ids = await greedy_reply(host, PROMPT, 8)
            return ids, host.members_info(), await cosine_to_float(host, [5, 17, 42, 99, 7, 3, 250, 11])
    ids, members, cosine = trio.run(main)
    assert len(ids) == 8 and cosine > 0.999  # its logits point where float32 transformers' do
    assert [m["dtype"] for m in members] == ["float32", "bfloat16"]
