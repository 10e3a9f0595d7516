"""`sfchat host --headless`: a plain prompt loop on stdin, for servers and scripts.

Answers stream to stdout; everything else (the invite, joins and losses, logs, command replies) goes to stderr
as whole lines, held back while an answer streams so none lands in the middle of it. The slash commands are
the chat screen's.
"""
from __future__ import annotations

import logging
import sys
from dataclasses import replace

import trio

from peers.adaptive import KPolicy
from peers.chat import Chat

from . import settings as settings_mod
from . import store
from .ask import length_note
from .options import RingOptions
from .runtime import build_host, invite_for, new_drafter, open_ring
from .serve.command import serving_beside
from .tui.commands import HELP, CommandError, current_k, current_temperature, parse

SCREEN_ONLY = ("chats", "copy")


class Lines:
    """stderr lines that wait while an answer streams on stdout."""

    def __init__(self) -> None:
        self.streaming, self.held = False, []

    def say(self, *a) -> None:
        text = " ".join(str(x) for x in a)
        if self.streaming:
            self.held.append(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def begin(self) -> None:
        self.streaming = True

    def end(self) -> None:
        self.streaming = False
        held, self.held = self.held, []
        for text in held:
            self.say(text)


class LinesHandler(logging.Handler):
    def __init__(self, lines: Lines) -> None:
        super().__init__()
        self.lines = lines
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.say(self.format(record))


class RingWatch:
    """Joins, losses and re-plans of the host's ring, each said once as its own line."""

    def __init__(self, lines: Lines) -> None:
        self.lines, self.states, self.epoch, self.host = lines, {}, 0, None

    def __call__(self) -> None:
        if self.host is None:
            return
        for m in self.host.members:
            before = self.states.get(m.id)
            if before is None:
                self.lines.say(f"+ member {m.id} ({m.name}) joined from {m.data_addr} ({m.device})")
            if m.state == "lost" and before != "lost" and not self.host.roster.closing:
                self.lines.say(f"- member {m.id} ({m.name}) lost: {m.error or 'its connection closed'}")
            self.states[m.id] = m.state
        if self.host.epoch != self.epoch and self.host.epoch > 1:
            spans = [f"host {self.host.shard.span}"] + [f"member {m.id} {m.span}" for m in self.host.ring]
            self.lines.say("ring: " + " -> ".join(spans))
        self.epoch = self.host.epoch


async def host_repl(opts: RingOptions) -> int:
    lines = Lines()
    root = logging.getLogger()
    handlers, root.handlers = root.handlers, [LinesHandler(lines)]
    try:
        return await _repl(opts, lines)
    finally:
        root.handlers = handlers


async def _repl(opts: RingOptions, lines: Lines) -> int:
    watch = RingWatch(lines)
    answer = opts.answer  # replaced, not changed, by /k and /temp
    host = build_host(opts, on_change=watch)
    host.say = lines.say
    watch.host = host
    s = settings_mod.load()
    async with open_ring(opts, host=host) as ring:
        lines.say(f"sfchat host on {host.address}. On each other machine run:\n  {invite_for(opts, host)}")
        lines.say("Type a prompt, or /help.")
        drafter = await new_drafter(answer.draft, ring, say=lines.say)
        chat = Chat(host, ring.tokenizer, ring.eos)
        policy = KPolicy(pinned=answer.k)
        async with serving_beside(ring, drafter, opts, say=lines.say):  # with --serve
            while True:
                sys.stderr.write("> ")
                sys.stderr.flush()
                line = await trio.to_thread.run_sync(sys.stdin.readline)
                if not line:
                    return 0
                text = line.strip()
                if not text:
                    continue
                if text.startswith("/"):
                    try:
                        cmd = parse(text)
                    except CommandError as e:
                        lines.say(str(e))
                        continue
                    if cmd.name == "quit":
                        return 0
                    if cmd.name == "new":
                        await host.drop(chat.rs)
                        chat = Chat(host, ring.tokenizer, ring.eos)
                        lines.say("New chat.")
                    elif cmd.name == "draft":
                        try:
                            drafter = await new_drafter(cmd.value, ring, say=lines.say)
                        except Exception as e:  # noqa: BLE001 - a draft that does not load is not saved
                            lines.say(f"/draft: cannot use {cmd.value}: {e}")
                            continue
                        s.draft = cmd.value
                        answer = replace(answer, draft=s.draft_spec)
                        lines.say(f"draft {drafter.name}; saved in {settings_mod.save(s)}")
                    elif cmd.name == "k" and cmd.value is None:
                        lines.say(current_k(answer.k))
                    elif cmd.name == "temp" and cmd.value is None:
                        lines.say(current_temperature(answer.temperature))
                    elif cmd.name == "k":
                        s.k = cmd.value
                        answer = replace(answer, k=s.k_pinned)
                        policy.pinned = answer.k
                        lines.say(f"K {s.k}; saved in {settings_mod.save(s)}")
                    elif cmd.name == "temp":
                        s.temperature = cmd.value
                        answer = replace(answer, temperature=cmd.value)
                        lines.say(f"temperature {cmd.value:g}; saved in {settings_mod.save(s)}")
                    elif cmd.name == "invite":
                        lines.say(invite_for(opts, host))
                    elif cmd.name == "help":
                        lines.say("\n".join(f"  {c:<28} {what}" for c, what in HELP if c.split()[0][1:] not in SCREEN_ONLY))
                    elif cmd.name == "save":
                        lines.say(export(chat, cmd.value))
                    else:
                        lines.say(f"/{cmd.name} works on the chat screen only (sfchat host without --headless)")
                    continue
                lines.begin()
                try:
                    _, result = await chat.reply(text, drafter=drafter, params=answer.sampling(), policy=policy,
                                                 max_new_tokens=answer.max_new_tokens,
                                                 on_text=lambda d: (sys.stdout.write(d), sys.stdout.flush()))
                except ValueError as e:  # a prompt past the context: refused, the chat goes on
                    lines.end()
                    lines.say(f"refused: {e}")
                    continue
                print(flush=True)
                lines.end()
                if chat.dropped:
                    lines.say(f"(dropped the {chat.dropped} oldest message(s) to fit the model's context)")
                if result.finish == "length":
                    lines.say(length_note(answer.max_new_tokens, len(result.token_ids)).replace(
                        "--max-new-tokens", "--max-new-tokens when starting the host"))


def export(chat: Chat, target: str | None) -> str:
    if not target:
        return "/save FILE.md exports this chat (headless chats are not kept otherwise)"
    conv = store.Conversation(messages=chat.messages)
    from pathlib import Path

    path = Path(target).expanduser()
    try:
        store.write_atomic(path, store.to_markdown(conv))
    except OSError as e:
        return f"cannot write {path}: {store.why_not_written(path, e)}"
    return f"exported to {path}"
