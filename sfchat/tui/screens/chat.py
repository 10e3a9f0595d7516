"""The host's screen: the conversation and the prompt, with the stats and the ring beside them."""
from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from sfchat import settings as settings_mod
from sfchat import store
from sfchat.options import RingOptions

from .. import clipboard, commands
from ..messages import (AnswerDelta, AnswerDone, AnswerFailed, DraftChecked, EngineFailed, LogLine, Ready, Recovering,
                        RingChanged, RoundDone, Status)
from ..widgets.conversation import ChatMessage, Conversation
from ..widgets.prompt import PromptInput
from ..widgets.ring import RingPanel
from ..widgets.stats import StatsPanel
from .help import HelpScreen
from .history import HistoryScreen
from .legend import LegendScreen


def drafter_label(spec: str | None) -> str:
    return "auto" if spec is None else spec


def finish_tag(msg: AnswerDone, max_new_tokens: int) -> str:
    """The answer's border note: why it ended, when that was not the model's own end."""
    if msg.finish == "stopped":
        return "stopped"
    if msg.finish != "length":
        return ""
    if msg.cut_by_context:
        return "cut: the model's context is full (/new starts over)"
    return f"length limit ({max_new_tokens} tokens): raise it with --max-new-tokens"


class ChatScreen(Screen):
    BINDINGS = [
        Binding("escape", "stop", "Stop answer"),
        Binding("f1", "help", "Help"),
        Binding("f2", "legend", "Stats legend", show=False),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("ctrl+o", "chats", "Chats"),
        Binding("ctrl+y", "copy_answer", "Copy answer"),
        Binding("ctrl+t", "copy_invite", "Copy invite"),
    ]
    KEYS = [("Enter", "send the prompt or run the /command"), ("Up / Down", "walk the prompt history"),
            ("Esc", "stop the answer"), ("F1", "help"), ("F2", "what the stats panel shows"), ("Ctrl+N", "new chat"),
            ("Ctrl+O", "saved chats"),
            ("Ctrl+Y", "copy the last answer"), ("Ctrl+T", "copy the invite command"),
            ("Ctrl+Q", "quit, stopping every process sfchat started")]

    def __init__(self, opts: RingOptions, settings: settings_mod.Settings, conv: store.Conversation) -> None:
        super().__init__()
        self.settings, self.conv = settings, conv
        # how the next answer is made: the slash commands replace it, an answer under way keeps its own
        self.answer = opts.answer
        if conv.temperature is not None:  # a saved chat keeps its own temperature
            self.answer = replace(self.answer, temperature=conv.temperature)
        self.drafter_name = drafter_label(self.answer.draft)
        self.ready = False
        self.stopped_error: str | None = None  # the engine died: say so instead of queueing prompts
        self.n = 0  # answers sent in this session
        self.answering = False
        self.live: int | None = None  # the answer being shown (None once the chat it belonged to is gone)
        self.current: ChatMessage | None = None
        self.recovering = False  # the status line says the ring broke, until a round goes through again
        self.ring_problem = ""  # why the ring cannot answer now (the host's row), shown on the status line
        self.last_answer = next((m["content"] for m in reversed(conv.messages) if m["role"] == "assistant"), "")

    @property
    def engine(self):
        return getattr(self.app, "engine", None)

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="top"):
            with Vertical(id="main"):
                yield Conversation(id="conversation")
                yield PromptInput(placeholder="Ask anything, or /help", id="prompt")
                yield Static("", id="status")
            yield StatsPanel(id="stats")
        yield RingPanel(id="ring")
        yield Footer()

    async def on_mount(self) -> None:
        await self.query_one(Conversation).show(self.conv.messages)
        prompt = self.query_one(PromptInput)
        for m in self.conv.messages:
            if m["role"] == "user":
                prompt.remember(m["content"])
        self.show_settings()
        self.set_status("starting the ring…")
        prompt.focus()

    # --- helpers --------------------------------------------------------------------------------------------

    def set_status(self, text: str, error: bool = False) -> None:
        status = self.query_one("#status", Static)
        status.update(text)
        status.set_class(error, "error")

    def show_settings(self) -> None:
        self.query_one(StatsPanel).show_settings(self.answer.temperature, self.answer.k, self.drafter_name)

    def save(self) -> None:
        if self.conv.messages:  # no files for chats that never started
            store.save(self.conv)

    async def end_stream(self, text: str | None = None) -> None:
        if self.current is not None:
            await self.current.end_stream(text)

    # --- the prompt line ------------------------------------------------------------------------------------

    async def on_input_submitted(self, event: PromptInput.Submitted) -> None:
        text = event.value.strip()
        if not text:
            return
        prompt = self.query_one(PromptInput)
        prompt.remember(text)
        prompt.value = ""
        if text.startswith("/"):
            await self.run_command(text)
        elif self.answering:
            prompt.value = text
            self.notify("Still answering: Esc stops it.", severity="warning")
        elif self.stopped_error:
            prompt.value = text
            self.notify(f"The ring is not running ({self.stopped_error}); Ctrl+Q quits.", severity="error")
        else:
            await self.send(text)

    async def send(self, text: str) -> None:
        self.n += 1
        self.answering, self.live = True, self.n
        view = self.query_one(Conversation)
        await view.add("user", text)
        self.current = await view.add("assistant")
        self.current.border_subtitle = "answering…"
        self.current.start_stream()
        self.conv.messages.append({"role": "user", "content": text})
        self.save()
        if self.engine is not None:
            self.engine.ask(self.n, text, self.answer)
        self.set_status("answering… (Esc stops)" if self.ready else "waiting for the ring…")

    async def run_command(self, line: str) -> None:
        try:
            cmd = commands.parse(line)
        except commands.CommandError as e:
            self.notify(str(e), severity="error")
            return
        s = self.settings
        match cmd.name:
            case "k" if cmd.value is None:
                self.notify(commands.current_k(self.answer.k))
            case "temp" if cmd.value is None:
                self.notify(commands.current_temperature(self.answer.temperature))
            case "k":
                s.k = cmd.value
                self.answer = replace(self.answer, k=s.k_pinned)
                self.remember_settings(f"K {s.k}")
            case "temp":
                s.temperature = self.conv.temperature = cmd.value
                self.answer = replace(self.answer, temperature=cmd.value)
                self.save()
                self.remember_settings(f"temperature {cmd.value:g}")
            case "draft":
                if self.engine is None:
                    self.use_draft(cmd.value)
                else:  # saved once the engine has loaded it: a draft that does not work is never saved
                    self.notify(f"loading draft {cmd.value}…")
                    self.engine.check_draft(cmd.value)
            case "new":
                await self.action_new_chat()
            case "chats":
                self.action_chats()
            case "save":
                self.save_command(cmd.value)
            case "copy":
                self.action_copy_answer()
            case "invite":
                self.action_copy_invite()
            case "help":
                self.action_help()
            case "quit":
                await self.app.action_quit()

    def use_draft(self, value: str, name: str | None = None) -> None:
        self.settings.draft = value
        self.answer = replace(self.answer, draft=self.settings.draft_spec)
        self.drafter_name = name or drafter_label(self.answer.draft)
        self.remember_settings(f"draft {value}")

    def on_draft_checked(self, msg: DraftChecked) -> None:
        if msg.error is not None:
            self.notify(f"/draft {msg.spec}: {msg.error} (not saved)", severity="error")
        else:
            self.use_draft(msg.spec, msg.name)

    def remember_settings(self, what: str) -> None:
        path = settings_mod.save(self.settings)
        self.show_settings()
        self.notify(f"{what}; saved in {path}")

    def save_command(self, target: str | None) -> None:
        if target is None:
            if not self.conv.messages:
                self.notify("Nothing to save yet.")
                return
            self.notify(f"Saved {store.save(self.conv)}")
            return
        path = Path(target).expanduser()
        try:
            store.write_atomic(path, store.to_markdown(self.conv))
        except OSError as e:
            self.notify(f"Cannot write {path}: {store.why_not_written(path, e)}", severity="error")
            return
        self.notify(f"Exported to {path}")

    # --- actions --------------------------------------------------------------------------------------------

    def action_stop(self) -> None:
        if self.answering and self.engine is not None:
            self.engine.stop_answer(self.n)
            self.set_status("stopping…")

    def action_help(self) -> None:
        self.app.push_screen(HelpScreen(self.KEYS))

    def action_legend(self) -> None:
        self.app.push_screen(LegendScreen())

    async def action_new_chat(self) -> None:
        await self.open(store.Conversation(model=self.conv.model, temperature=self.answer.temperature))
        self.notify("New chat.")

    def action_chats(self) -> None:
        async def chosen(chat_id: str | None) -> None:
            if chat_id is not None and chat_id != self.conv.id:
                await self.open(store.load(chat_id))
                self.notify(f"Reopened {self.conv.title!r}.")

        self.app.push_screen(HistoryScreen(), chosen)

    async def open(self, conv: store.Conversation) -> None:
        """Show another chat; an answer still running for the old one is stopped and its output dropped."""
        if self.answering:
            self.action_stop()
        await self.end_stream()
        self.live, self.current = None, None
        self.conv = conv
        if conv.temperature is not None:  # a saved chat keeps its own temperature
            self.answer = replace(self.answer, temperature=conv.temperature)
        self.show_settings()
        await self.query_one(Conversation).show(conv.messages)
        self.set_status("ready" if self.ready else "waiting for the ring…")
        self.last_answer = next((m["content"] for m in reversed(conv.messages) if m["role"] == "assistant"), "")
        if self.engine is not None:
            self.engine.load(conv.messages)

    def action_copy_answer(self) -> None:
        if not self.last_answer:
            self.notify("No answer to copy yet.")
            return
        self.notify(f"Copied the last answer to {clipboard.copy(self.app, self.last_answer)}.")

    def action_copy_invite(self) -> None:
        command = self.query_one(RingPanel).command
        if not command:
            self.notify("No invite yet: the ring is starting.")
            return
        self.notify(f"Copied the invite command to {clipboard.copy(self.app, command)}.")

    # --- what the engine says -------------------------------------------------------------------------------

    def on_status(self, msg: Status) -> None:
        if not self.ready:
            self.set_status(msg.text)

    def on_ready(self, msg: Ready) -> None:
        self.ready = True
        self.sub_title = msg.model
        self.conv.model = msg.model  # what a saved chat records (the default model's name, when none was named)
        self.drafter_name = msg.drafter
        self.show_settings()
        self.set_status("answering… (Esc stops)" if self.answering else f"ready: {msg.model}")

    def on_ring_changed(self, msg: RingChanged) -> None:
        self.query_one(RingPanel).show(msg.members, msg.invite, msg.serving)
        problem = msg.members[0].get("error", "") if msg.members else ""
        if problem != self.ring_problem and self.ready and not self.answering:  # why prompts are refused, or not
            self.set_status(f"the ring cannot answer: {problem}" if problem else "ready", error=bool(problem))
        self.ring_problem = problem

    def on_answer_delta(self, msg: AnswerDelta) -> None:
        if msg.n == self.live:
            self.current.feed(msg.text)

    def on_round_done(self, msg: RoundDone) -> None:
        self.query_one(StatsPanel).add_round(msg.event)
        if self.recovering:  # a round went through: the ring is whole again
            self.recovering = False
            self.set_status("the ring is whole again; answering… (Esc stops)")

    def on_recovering(self, msg: Recovering) -> None:
        self.recovering = True
        self.set_status(f"the ring broke ({msg.error}); re-planning and replaying…", error=True)

    async def on_answer_done(self, msg: AnswerDone) -> None:
        self.drafter_name = msg.drafter
        self.show_settings()
        if msg.n != self.live:  # the answer of a chat no longer shown (stopped by /new or reopening)
            self.answering = False
            self.set_status("ready")
            return
        await self.end_stream(msg.text)
        self.query_one(StatsPanel).answer_done()
        self.recovering = False
        self.current.border_subtitle = finish_tag(msg, self.answer.max_new_tokens)
        self.live = None
        self.last_answer = msg.text
        self.conv.messages = msg.messages
        self.save()
        self.answering = False  # only now: ending the stream yields, and the answer is whole once this is False
        status = "stopped" if msg.finish == "stopped" else "ready"
        if msg.finish == "length":  # the answer did not end: say so where the eye is, not only on its border
            status = "ready; the answer was cut: " + ("the model's context is full" if msg.cut_by_context else
                                                      f"it reached --max-new-tokens ({self.answer.max_new_tokens})")
        if msg.dropped:
            status += f" (dropped the {msg.dropped} oldest message(s) to fit the model's context)"
        self.set_status(status)

    async def on_answer_failed(self, msg: AnswerFailed) -> None:
        if msg.n != self.live:
            self.answering = False
            self.set_status("ready")
            return
        await self.end_stream()
        self.query_one(StatsPanel).answer_done()
        self.recovering = False
        self.current.border_subtitle = "failed"
        self.current.add_class("error")
        self.live = None
        self.conv.messages = msg.messages
        self.save()
        self.answering = False
        self.set_status(f"the answer failed: {msg.error}", error=True)

    async def on_engine_failed(self, msg: EngineFailed) -> None:
        self.ready, self.stopped_error = False, msg.error
        self.app.fatal = msg.error
        if self.answering:
            self.answering = False
            await self.end_stream()
        self.set_status(f"the ring stopped: {msg.error} (Ctrl+Q quits)", error=True)
        self.notify(msg.error, title="the ring stopped", severity="error", timeout=30)

    def on_log_line(self, msg: LogLine) -> None:
        if msg.level >= logging.WARNING:
            self.notify(msg.text, severity="error" if msg.level >= logging.ERROR else "warning")
