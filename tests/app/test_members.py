"""Joining: tokens, memory, several sessions, sampling seeds — with real peer processes."""
import os
import sys

import pytest
import trio

from helpers import ask_json, child_env, greedy_reply, reference_ids, running_ring


def join_cmd(addr, token, model):
    return [sys.executable, "-m", "sfchat", "join", addr, "--token", token, "--headless", "--model", str(model),
            "--listen", "127.0.0.1:0"]


def test_wrong_token_is_refused_and_joiner_exits_nonzero(tiny_llama, caplog):
    async def main():
        async with running_ring(tiny_llama, 0, token="right-token") as (host, _):
            p = await trio.run_process(join_cmd(host.address, "wrong-token", tiny_llama), capture_stdout=True,
                                       capture_stderr=True, check=False, env=child_env())
            with trio.fail_after(10):  # the host has dealt with that connection: it logged the refusal
                while not any("token" in r.getMessage() for r in caplog.records if r.name == "sfchat.host"):
                    await trio.sleep(0.01)
            assert host.members == []
        return p

    p = trio.run(main)
    assert p.returncode != 0
    err = p.stderr.decode().strip().splitlines()
    assert "token" in err[-1] and len(err[-1]) < 200, err
    assert "right-token" not in p.stderr.decode()
    assert any("token" in r.getMessage() for r in caplog.records if r.name == "sfchat.host")


@pytest.mark.slow
def test_peer_with_half_the_layers_uses_well_under_the_whole_model(smollm2):
    """SmolLM2 is 540 MB in float32; a peer holding about half of 30 layers (no embedding, no head) adds ~200 MB.
    (The host holds the embedding and head on the same offer, so the peer gets a layer or two more.)"""
    async def main():
        async with running_ring("smollm2-135m", 1, extra=["--offer-gb", "1.0"], offer_gb=1.0,
                                conversations=1) as (host, _):
            m = host.ring[0]
            assert 15 <= m.span.size <= 17
            return m.rss - m.rss_before

    used = trio.run(main)
    whole = os.path.getsize(smollm2 / "model.safetensors")
    assert 0 < used < 0.5 * whole, (used, whole)


def test_two_sessions_at_once_stay_correct(tiny_qwen2):
    """Two conversations interleave their rounds on the same ring; each equals its run alone."""
    prompts = ["hello world", "the quick brown fox jumps"]

    async def main():
        alone, together = {}, {}
        async with running_ring(tiny_qwen2, 2) as (host, _):
            async def one(p, out):
                out[p] = await greedy_reply(host, p, 20)

            for p in prompts:
                await one(p, alone)
            async with trio.open_nursery() as n2:
                for p in prompts:
                    n2.start_soon(one, p, together)
        return alone, together

    alone, together = trio.run(main)
    assert together == alone


def test_sampling_with_a_seed_is_reproducible(tiny_llama):
    """`sfchat ask --seed 7` in a process of its own, and seeds 7 and 8 answered on another ring of a host and a
    peer process: the same seed, the same answer; another seed, another."""
    from shared_ring import SharedRing

    ring = ["--model", str(tiny_llama), "--local-peers", "1"]
    answer = ["--max-new-tokens", "16", "--temperature", "0.9", "--top-p", "0.95", "--draft", "ngram"]
    a = ask_json("the quick brown", *ring, *answer, "--seed", "7")
    other = SharedRing(*ring)
    try:
        b, c = (other.ask("the quick brown", *answer, "--seed", seed) for seed in ("7", "8"))
    finally:
        other.close()
    assert a["token_ids"] == b["token_ids"]
    assert a["token_ids"] != c["token_ids"]


def test_a_member_with_other_weights_is_refused(tiny_llama, tmp_path):
    """Same config, other tensors: refused with a clear message before it serves, never garbage text. The joiner
    leaves with that line and a non-zero exit; the host takes its layers back and answers exactly."""
    from tiny import make_model
    other = make_model(tmp_path / "other", "llama", layers=4, seed=99)
    prompt = "hello world"

    async def main():
        async with running_ring(tiny_llama, 1, extra=["--model", str(other)], plan=False) as (host, lp):
            await host.replan()  # (the last --model wins: the member starts on the other weights)
            with trio.fail_after(30):
                while lp.procs[0].poll() is None:
                    await trio.sleep(0.05)
            exit_code, last = lp.procs[0].returncode, lp.log_paths[0].read_text().strip().splitlines()[-1]
            spans = [host.shard.span] + [m.span for m in host.ring]
            ids = await greedy_reply(host, prompt, 8)
        return host.members[0], exit_code, last, spans, ids

    member, exit_code, last, spans, ids = trio.run(main)
    assert member.state in ("failed", "lost") and "not the host's" in member.error and "--model" in member.error
    assert exit_code != 0 and "not the host's" in last and "--model" in last
    assert [(s.start, s.end) for s in spans] == [(0, 4)]
    assert ids == reference_ids(tiny_llama, prompt, 8)


def test_tokens_never_look_like_options():
    from peers.links.auth import new_token
    assert not any(new_token().startswith("-") for _ in range(5000))
