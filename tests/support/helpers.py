"""Running the real CLI and plain transformers side by side."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path

import torch
import trio
from transformers import AutoModelForCausalLM, AutoTokenizer

from peers.speculation.adaptive import KPolicy
from peers.conversation.chat import Chat, eos_ids, load_tokenizer
from peers.speculation.drafting import Drafter, make_drafter
from peers.host.host import Host
from peers.base.options import HostOptions
from peers.speculation.sampling import SamplingParams
from forked_peers import ForkedLocalPeers
from sfchat.local import LocalPeers

ROOT = Path(__file__).resolve().parents[2]


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a process a test starts: this checkout importable, plus `extra`."""
    return dict(os.environ, PYTHONPATH=str(ROOT), **extra)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int, args_with: str = "") -> list[int]:
    """The processes `pid` started (those whose command line holds `args_with`)."""
    out = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines() if args_with in line]


def wait_for_line(log: Path, pattern: str, proc: subprocess.Popen | None = None, timeout: float = 60) -> re.Match:
    """The first match of `pattern` in the log a process writes, once it is there; fails with the log if the
    process ends first or the time runs out."""
    deadline = time.monotonic() + timeout
    while not (m := re.search(pattern, text := log.read_text() if log.exists() else "")):
        ended = proc is not None and proc.poll() is not None
        assert not ended and time.monotonic() < deadline, f"no {pattern!r} in {log}:\n{text[-3000:]}"
        time.sleep(0.05)
    return m


async def until(pilot, cond, what: str, timeout: float = 90) -> None:
    """Let a Textual app run until cond() holds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.05)


def assert_covers(ring, n_layers: int | None = None) -> None:
    """Every layer of the model is held exactly once: the spans, host first, are contiguous from 0 to the model's
    layer count. `ring`: a Host (its shard's span, then its ring's in pass order), or the members that
    `ask --json` and /health list ("layers" as "a-b", "" or "none" for those holding none, with n_layers)."""
    if isinstance(ring, list):
        spans = sorted((int(a), int(b) + 1) for a, b in (m["layers"].split("-") for m in ring
                                                          if m["layers"] not in ("", "none")))
    else:
        n_layers = ring.config.num_hidden_layers
        spans = [(s.start, s.end) for s in [ring.shard.span] + [m.span for m in ring.ring]]
    assert spans and spans[0][0] == 0, spans
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), f"not contiguous: {spans}"
    assert spans[-1][1] == n_layers, f"{spans} of {n_layers} layers"


def sfchat(*args: str, timeout: float = 300, check: bool = True,
           input: str | None = None) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "sfchat", *args], capture_output=True, text=True, timeout=timeout,
                       env=child_env(), cwd=ROOT, input=input)
    if check and p.returncode != 0:
        raise AssertionError(f"sfchat {' '.join(args)} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return p


def ask_json(prompt: str, *args: str, timeout: float = 300) -> dict:
    p = sfchat("ask", prompt, "--json", *args, timeout=timeout)
    return json.loads(p.stdout.strip().splitlines()[-1])


def reference_ids(model_dir: Path, prompt: str | list[dict], max_new_tokens: int) -> list[int]:
    """Plain transformers generate, greedy, on the same weights and the same chat-templated prompt (or chat)."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    chat = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt")["input_ids"]
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
async def running_ring(model, n_peers: int, *, extra: list[str] | None = None, plan: bool = True,
                       fresh: bool = False, **host_kw):
    """A Host in this process and n real peer processes on loopback (forked from tests/support/peer_zygote.py, or started
    afresh as `sfchat ask --local-peers` starts them where `fresh`), planned (unless not `plan`: then the test
    plans); torn down after, where a healthy ring must still hold every layer once."""
    host = quiet_host(model, **host_kw)
    async with trio.open_nursery() as nursery:
        await nursery.start(host.serve)
        addr = host.relay_address or host.address
        start_peers = LocalPeers if fresh else ForkedLocalPeers
        with start_peers(n_peers, addr, host.token, model=str(model), extra=extra) as lp:
            try:
                if n_peers:
                    try:
                        async with trio.open_nursery() as setup:  # a peer that dies joining fails at once
                            setup.start_soon(fail_if_a_peer_exits, lp)
                            await host.wait_members(n_peers, timeout=120)
                            setup.cancel_scope.cancel()
                    except BaseExceptionGroup as group:  # the one error, as the ring raised it
                        raise group.exceptions[0] if len(group.exceptions) == 1 else group from None
                    if plan:
                        await host.replan()  # (one that cannot take its layers leaves: the plan says why)
                yield host, lp
            except BaseException:
                print(lp.tails(), file=sys.stderr)  # what the peers said, shown with the failure
                raise
            if host.shard is not None and all(m.state == "ready" for m in host.ring):
                assert_covers(host)
            await host.close()
        nursery.cancel_scope.cancel()


def new_chat(host) -> Chat:
    tok = load_tokenizer(host.model_dir)
    return Chat(host, tok, eos_ids(host.model_dir, host.config, tok))


async def greedy_reply(host, prompt: str, max_new_tokens: int) -> list[int]:
    _, r = await new_chat(host).reply(prompt, drafter=Drafter(), params=SamplingParams(), policy=KPolicy(),
                                      max_new_tokens=max_new_tokens)
    return r.token_ids


async def replan_under_a_waiting_batch(host) -> None:
    """A re-plan as a join's: the passes in flight first, then, while a batch of the conversations' next rounds
    waits at the gate, the new plan; those rounds then replay."""
    async with host.planner.gate.alone():
        while not host.batcher.flying:
            await trio.sleep(0.01)
        await host.planner._replan(host.port)


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


async def cosine_to_float(host, ids: list[int], n: int = 4) -> float:
    """The least cosine, over the last n+1 positions of one pass of `ids` through the ring, between its logits and
    plain transformers' in float32 on the same weights: how far another dtype or quantization took them."""
    ref = AutoModelForCausalLM.from_pretrained(host.model_dir, dtype=torch.float32)
    logits, _ = await host.forward(host.new_session("cosine"), ids[:-n], ids[-n:])
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0, -n - 1:]
    return float(torch.nn.functional.cosine_similarity(logits.float(), want, dim=-1).min())


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
