"""Running the real CLI and plain transformers side by side."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from contextlib import asynccontextmanager

import torch
import trio
from transformers import AutoModelForCausalLM, AutoTokenizer

from peers.adaptive import KPolicy
from peers.chat import Chat, eos_ids, load_tokenizer
from peers.drafting import Drafter, make_drafter
from peers.host import Host
from peers.options import HostOptions
from peers.sampling import SamplingParams
from sfchat.local import LocalPeers

ROOT = Path(__file__).resolve().parent.parent


def sfchat(*args: str, timeout: float = 300, check: bool = True,
           input: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "sfchat", *args], capture_output=True, text=True, timeout=timeout,
                       env=env, cwd=ROOT, input=input)
    if check and p.returncode != 0:
        raise AssertionError(f"sfchat {' '.join(args)} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return p


def ask_json(prompt: str, *args: str, timeout: float = 300) -> dict:
    p = sfchat("ask", prompt, "--json", *args, timeout=timeout)
    return json.loads(p.stdout.strip().splitlines()[-1])


def reference_ids(model_dir: Path, prompt: str, max_new_tokens: int) -> list[int]:
    """Plain transformers generate, greedy, on the same weights and the same chat-templated prompt."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                  return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


def quiet_host(model, **opts) -> Host:
    """A Host of `model` with these HostOptions fields, saying nothing."""
    return Host(HostOptions(str(model), **opts), say=lambda *a: None)


async def fail_if_a_peer_exits(lp: LocalPeers) -> None:
    while True:
        lp.check()
        await trio.sleep(0.2)


@asynccontextmanager
async def running_ring(model, n_peers: int, *, extra: list[str] | None = None, **host_kw):
    """A Host in this process and n real peer processes on loopback, planned; torn down after."""
    host = quiet_host(model, **host_kw)
    async with trio.open_nursery() as nursery:
        await nursery.start(host.serve)
        addr = host.relay_address or host.address
        with LocalPeers(n_peers, addr, host.token, model=str(model), extra=extra) as lp:
            try:
                if n_peers:
                    try:
                        async with trio.open_nursery() as setup:  # a peer that dies joining fails at once
                            setup.start_soon(fail_if_a_peer_exits, lp)
                            await host.wait_members(n_peers, timeout=120)
                            setup.cancel_scope.cancel()
                    except BaseExceptionGroup as group:  # the one error, as the ring raised it
                        raise group.exceptions[0] if len(group.exceptions) == 1 else group from None
                    await host.replan()  # (one that cannot take its layers leaves: the plan says why)
                yield host, lp
            except BaseException:
                print(lp.tails(), file=sys.stderr)  # what the peers said, shown with the failure
                raise
            await host.close()
        nursery.cancel_scope.cancel()


def new_chat(host) -> Chat:
    tok = load_tokenizer(host.model_dir)
    return Chat(host, tok, eos_ids(host.model_dir, host.config, tok))


async def greedy_reply(host, prompt: str, max_new_tokens: int) -> list[int]:
    _, r = await new_chat(host).reply(prompt, drafter=Drafter(), params=SamplingParams(), policy=KPolicy(),
                                      max_new_tokens=max_new_tokens)
    return r.token_ids


async def check_logits_follow(host, ref, tokens: list[int], steps: int) -> list[int]:
    """Greedy steps through the ring, each pass's last logits equal to the reference model's."""
    rs = host.new_session("check")
    tokens = list(tokens)
    for _ in range(steps):
        logits, timing = await host.forward(rs, tokens, [])
        with torch.no_grad():
            want = ref(torch.tensor([tokens])).logits[0, -1]
        torch.testing.assert_close(logits[-1], want, atol=1e-4, rtol=1e-4)
        assert len(timing["peers"]) == len(host.ring)
        tokens.append(int(want.argmax()))
        rs.set_position(len(tokens) - 1, len(tokens))
    # a repeated pass with an older committed length is harmless (the trim rule)
    rs.set_position(rs.ring_len - 3, len(tokens))
    logits, _ = await host.forward(rs, tokens, [])
    with torch.no_grad():
        torch.testing.assert_close(logits[-1], ref(torch.tensor([tokens])).logits[0, -1], atol=1e-4, rtol=1e-4)
    return tokens


async def answer(model, draft_spec, *, prompt: str, k=None, params=None, max_new: int = 24, peers: int = 0,
                 policy=None):
    """One answer through a host with `peers` peer processes (default none) speculating with `draft_spec`
    (K pinned to k, or adaptive; or chosen by `policy`)."""
    async with running_ring(model, peers) as (host, _):
        chat = new_chat(host)
        drafter = make_drafter(draft_spec, host.model_dir, host.config.vocab_size, chat.tokenizer)
        _, r = await chat.reply(prompt, drafter=drafter, params=params or SamplingParams(),
                                policy=policy or KPolicy(pinned=k), max_new_tokens=max_new)
    return r
