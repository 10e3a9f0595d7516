"""A member stopped by its user (Ctrl+C) says bye: the host says it left and re-plans, warns of no loss, and an
answer under way goes on, exact, as after a loss."""
from __future__ import annotations

import logging
import signal
import subprocess
import sys

import trio

from helpers import ROOT, child_env, new_chat, quiet_host, reference_ids
from peers.speculation.adaptive import KPolicy
from peers.speculation.drafting import Drafter
from peers.speculation.sampling import SamplingParams

PROMPT = "hello world, the quick brown fox"
# a joiner as a terminal starts it: Ctrl+C's SIGINT is not ignored (a test run in the background may ignore it)
INTERRUPTIBLE = "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"


def start_joiner(host, model, name: str = "joiner") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", INTERRUPTIBLE, sys.executable, "-m", "sfchat", "join", host.address,
                             "--token", host.token, "--model", str(model), "--headless", "--name", name,
                             "--listen", "127.0.0.1:0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            env=child_env(), cwd=ROOT)


def said(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("sfchat") and r.levelno >= level]


def test_a_member_stopped_mid_answer_leaves_and_the_answer_goes_on_exact(tiny_llama, caplog):
    caplog.set_level(logging.INFO)
    n = 120

    async def main():
        host = quiet_host(tiny_llama)
        async with trio.open_nursery() as nursery:
            await nursery.start(host.serve)
            joiner = start_joiner(host, tiny_llama)
            try:
                await host.wait_members(1, timeout=120)
                await host.replan()
                host.auto_replan = True
                held = [m.span.size for m in host.ring]

                def on_round(ev: dict) -> None:
                    if ev.get("event") == "round" and joiner.returncode is None and joiner.poll() is None:
                        joiner.send_signal(signal.SIGINT)  # once: its Ctrl+C, while the answer goes round

                _, result = await new_chat(host).reply(PROMPT, drafter=Drafter(), params=SamplingParams(),
                                                       policy=KPolicy(), max_new_tokens=n, on_round=on_round)
                with trio.fail_after(30):
                    while joiner.poll() is None:
                        await trio.sleep(0.05)
                state = host.members_info()[1]["state"]
                spans = [(host.shard.span.start, host.shard.span.end)] + [(m.span.start, m.span.end)
                                                                          for m in host.ring]
            finally:
                if joiner.poll() is None:
                    joiner.kill()
                joiner.wait()
            nursery.cancel_scope.cancel()
        return held, result.token_ids, state, spans

    held, ids, state, spans = trio.run(main)
    assert held == [2]  # it held layers when it left
    assert ids == reference_ids(tiny_llama, PROMPT, n)
    assert state == "left" and spans == [(0, 4)]
    assert said(caplog, logging.WARNING) == []  # no loss, no failed pass
    info = said(caplog, logging.INFO)
    assert "member 1 (joiner) left; re-planning" in info
    assert "member 1 (joiner) left; re-planning and replaying" in info  # the pass it was in, said as a departure


def test_the_headless_host_says_a_member_left_and_re_plans(tiny_llama):
    host = subprocess.Popen([sys.executable, "-m", "sfchat", "host", "--headless", "--model", str(tiny_llama),
                             "--listen", "127.0.0.1:0", "--token", "tok-leave", "--draft", "none"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(), cwd=ROOT)
    joiner = None
    try:
        lines = []

        def until(text: str) -> None:
            while text not in "".join(lines):
                line = host.stderr.readline()
                assert line, "".join(lines)
                lines.append(line)

        until(" join ")
        address = next(line for line in lines if " join " in line).split(" join ")[1].split()[0]
        joiner = subprocess.Popen([sys.executable, "-c", INTERRUPTIBLE, sys.executable, "-m", "sfchat", "join",
                                   address, "--model", str(tiny_llama), "--headless", "--name", "far",
                                   "--listen", "127.0.0.1:0"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                  env=child_env(SFCHAT_TOKEN="tok-leave"), cwd=ROOT)
        until("ring: host 0-1 -> member 1 2-3")
        joiner.send_signal(signal.SIGINT)
        until("- member 1 (far) left; re-planning")
        until("ring: host 0-3")
        _, err = host.communicate("/quit\n", timeout=60)
        lines.append(err)
        joiner.wait(timeout=60)  # (a busy machine takes a while to end a torch process)
    finally:
        for p in (host, joiner):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    out = "".join(lines)
    assert "WARNING" not in out and "lost" not in out, out
    assert joiner.returncode == 130  # stopped by Ctrl+C, as a shell counts it
