"""`sfchat host --headless`: a plain prompt loop on stdin, for servers and scripts.

Answers stream to stdout; everything else (the invite, joins and losses, logs, command replies) goes to stderr
as whole lines, as they happen: on a terminal that shows both, a line that comes while an answer streams goes
under the answer's line so far, and the answer goes on below it. The slash commands are the chat screen's.
"""
from __future__ import annotations

import logging
import sys
from dataclasses import replace

import trio

from peers import KPolicy
from peers import Chat
from peers import RingError

from . import settings as settings_mod
from . import invite, store
from .ask import length_note
from .options import RingOptions
from .runtime import build_host, compute_line, invite_for, new_drafter, open_ring
from .serve.command import serving_beside
from .tui.commands import HELP, CommandError, current_k, current_temperature, parse

SCREEN_ONLY = ("chats", "copy")
QUIT = [("/quit, Ctrl+D", "end the ring and quit (its members are told)")]


class Lines:
    """Whole lines on stderr, said when they happen, never inside the answer's line on a shared terminal."""

    def __init__(self) -> None:
        self.mid_line = False  # the answer's last piece on the terminal did not end its line
        self.shared = sys.stdout.isatty() and sys.stderr.isatty()  # both on one screen

    def say(self, *a) -> None:
        text = " ".join(str(x) for x in a)
        if self.mid_line:
            text, self.mid_line = "\n" + text, False
        print(text, file=sys.stderr, flush=True)

    def answer(self, piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()
        if piece:
            self.mid_line = self.shared and not piece.endswith("\n")

    def end(self) -> None:
        """The answer ended (its newline written)."""
        self.mid_line = False


class LinesHandler(logging.Handler):
    def __init__(self, lines: Lines) -> None:
        super().__init__()
        self.lines = lines
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.say(self.format(record))


class RingWatch:
    """Joins, departures and re-plans of the host's ring, each said once as its own line (a loss, or a member that
    cannot serve, is the host's log line)."""

    def __init__(self, lines: Lines) -> None:
        self.lines, self.states, self.layout, self.host = lines, {}, "", None

    def __call__(self) -> None:
        if self.host is None:
            return
        for m in self.host.members:
            before = self.states.get(m.id)
            if before is None:
                self.lines.say(f"+ member {m.id} ({m.name}) joined from {m.data_addr} ({m.device})")
            if m.state == "lost" and before != "lost" and m.left and not self.host.closing:
                self.lines.say(f"- member {m.id} ({m.name}) left" + ("; re-planning" if m.span and m.span.size else ""))
            self.states[m.id] = m.state
        if self.host.shard is not None:  # a re-plan that moved layers (not one that left them where they were)
            layout = " -> ".join([f"host {self.host.shard.span}"] + [f"member {m.id} {m.span}" for m in self.host.ring])
            if self.layout and layout != self.layout:
                self.lines.say("ring: " + layout)
            self.layout = layout


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
    host = build_host(opts, on_change=watch)
    host.say = lines.say
    watch.host = host
    async with open_ring(opts, host=host, stay=True) as ring:
        lines.say(f"sfchat host on {invite.listening(host)} ({host.device}, {compute_line(host)}). "
                  "On each other machine run:\n"
                  f"  {invite_for(opts, host)}")
        lines.say("Type a prompt, or /help.")
        chat = HeadlessChat(opts, ring, lines, await new_drafter(opts.answer.draft, ring, say=lines.say))
        async with serving_beside(ring, chat.drafter, opts, say=lines.say):  # with --serve
            while (text := await read_line()) is not None:
                if text.startswith("/"):
                    if not await chat.command(text):
                        break
                elif text:
                    await chat.reply(text)
    return 0


async def read_line() -> str | None:
    """The next line typed at the prompt, stripped; None at the end of the input."""
    sys.stderr.write("> ")
    sys.stderr.flush()
    line = await trio.to_thread.run_sync(sys.stdin.readline)
    return line.strip() if line else None


class HeadlessChat:
    """The chat at the prompt: its conversation, its drafter, and how it answers (replaced, not changed, by /k and
    /temp, each saved in the settings file)."""

    def __init__(self, opts: RingOptions, ring, lines: Lines, drafter) -> None:
        self.opts, self.ring, self.lines, self.drafter = opts, ring, lines, drafter
        self.answer = opts.answer
        self.settings = settings_mod.load()
        self.chat = Chat(ring.host, ring.tokenizer, ring.eos, reuse=opts.prefix_cache)
        self.policy = self.answer.pin(KPolicy())

    async def reply(self, text: str) -> None:
        """The answer streamed to stdout; a prompt past the context is refused and the chat goes on."""
        answer, lines = self.answer, self.lines
        try:
            _, result = await self.chat.reply(text, drafter=self.drafter, params=answer.sampling(), policy=self.policy,
                                              max_new_tokens=answer.max_new_tokens, on_text=lines.answer)
        except (ValueError, RingError) as e:  # past the context; a ring that cannot answer now
            lines.say(f"refused: {e}")
            return
        print(flush=True)
        lines.end()
        if self.chat.dropped:
            lines.say(f"(dropped the {self.chat.dropped} oldest message(s) to fit the model's context)")
        if result.finish == "length":
            lines.say(length_note(answer.max_new_tokens, len(result.token_ids)).replace(
                "--max-new-tokens", "--max-new-tokens when starting the host"))

    async def command(self, text: str) -> bool:
        """A slash command, its reply said as a line; False for /quit."""
        try:
            cmd = parse(text)
        except CommandError as e:
            self.lines.say(str(e))
            return True
        if cmd.name == "quit":
            return False
        s, say = self.settings, self.lines.say
        if cmd.name == "new":
            await self.ring.host.drop(self.chat.rs)
            self.chat = Chat(self.ring.host, self.ring.tokenizer, self.ring.eos, reuse=self.opts.prefix_cache)
            say("New chat.")
        elif cmd.name == "draft":
            await self.set_draft(cmd.value)
        elif cmd.name == "k" and cmd.value is None:
            say(current_k(self.answer.k))
        elif cmd.name == "temp" and cmd.value is None:
            say(current_temperature(self.answer.temperature))
        elif cmd.name == "k":
            s.k = cmd.value
            self.answer = replace(self.answer, k=s.k_pinned)
            self.answer.pin(self.policy)
            say(f"K {s.k}; saved in {settings_mod.save(s)}")
        elif cmd.name == "temp":
            s.temperature = cmd.value
            self.answer = replace(self.answer, temperature=cmd.value)
            say(f"temperature {cmd.value:g}; saved in {settings_mod.save(s)}")
        elif cmd.name == "invite":
            say(invite_for(self.opts, self.ring.host))
        elif cmd.name == "help":
            say("\n".join(f"  {c:<28} {what}" for c, what in HELP + QUIT if c.split()[0][1:] not in SCREEN_ONLY))
        elif cmd.name == "save":
            say(export(self.chat, cmd.value))
        else:
            say(f"/{cmd.name} works on the chat screen only (sfchat host without --headless)")
        return True

    async def set_draft(self, spec: str) -> None:
        """/draft: a draft that does not load is said so, and not saved."""
        try:
            self.drafter = await new_drafter(spec, self.ring, say=self.lines.say)
        except Exception as e:  # noqa: BLE001
            self.lines.say(f"/draft: cannot use {spec}: {e}")
            return
        self.settings.draft = spec
        self.answer = replace(self.answer, draft=self.settings.draft_spec)
        self.lines.say(f"draft {self.drafter.name}; saved in {settings_mod.save(self.settings)}")


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
