"""Trio runs the engine, Textual runs on asyncio: each keeps its own thread and loop.

Engine -> UI: Textual messages through `post` (`post_message`, thread-safe and non-blocking, so a busy UI never
stalls a round). UI -> engine: `TrioToken.run_sync_soon` drops a request into a trio memory channel; it never
waits for trio either. Model compute runs in trio's worker threads and in the peer processes, never on the UI loop.
"""
from __future__ import annotations

import contextvars
import dataclasses
import logging
import math
import threading

import trio

from peers import KPolicy
from peers import Chat
from peers import Host
from peers import PeerState
from sfchat.join import join_ring
from sfchat.options import AnswerOptions, JoinOptions, RingOptions
from sfchat.runtime import build_host, invite_for, new_drafter, open_ring
from sfchat.serve.command import serving_beside
from sfchat.user_errors import user_error

from .messages import (AnswerDelta, AnswerDone, AnswerFailed, DraftChecked, Ended, EngineFailed, LogLine, PeerChanged,
                       Ready, Recovering, RingChanged, RoundDone, Status)

log = logging.getLogger("sfchat.tui")


def describe(e: BaseException) -> str:
    err = user_error(e) or e
    return str(err) or type(err).__name__


class Worker:
    """A trio.run in its own thread, started with the UI's context so Textual knows its app there."""

    name = "sfchat-trio"

    def __init__(self, post):
        self.post = post
        self._token: trio.lowlevel.TrioToken | None = None
        self._lock = threading.Lock()
        self._scope: trio.CancelScope | None = None
        self._closing = False
        ctx = contextvars.copy_context()
        self.thread = threading.Thread(target=ctx.run, args=(self._thread,), name=self.name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _thread(self) -> None:
        try:
            trio.run(self._scoped)
        except BaseException as e:  # noqa: BLE001 - whatever killed the engine, the UI must say so and stay up
            log.exception("the engine stopped")
            self.post(EngineFailed(describe(e)))

    async def _scoped(self) -> None:
        with trio.CancelScope() as self._scope:
            with self._lock:
                self._token = trio.lowlevel.current_trio_token()
            if self._closing:
                return
            await self.main()

    async def main(self) -> None:
        raise NotImplementedError

    def call_soon(self, fn, *args) -> bool:
        """Run fn(*args) in the trio thread soon; False when trio is not running (yet or any more)."""
        if self._token is None:
            return False
        try:
            self._token.run_sync_soon(fn, *args)
            return True
        except trio.RunFinishedError:
            return False

    def close(self, timeout: float = 20) -> None:
        """Cancel everything (the ring closes its members and local peer processes on the way out) and wait."""
        self._closing = True
        if self._scope is not None:
            self.call_soon(self._scope.cancel)
        if self.thread.is_alive():
            self.thread.join(timeout)


class Engine(Worker):
    """The host, its ring and one chat; requests from the UI are served one at a time."""

    name = "sfchat-engine"

    def __init__(self, opts: RingOptions, post, messages: list[dict] | None = None):
        super().__init__(post)
        self.opts = opts
        self.stop_upto = 0  # Esc: answers numbered <= this stop at the next round
        self._requests, self._inbox = trio.open_memory_channel(math.inf)
        self._early: list[tuple] = []  # requests made before trio started
        self._first_messages = list(messages or [])
        self.host: Host | None = None
        self.lost_at: dict[int, int] = {}  # member id -> the ring epoch it was lost in
        self.serving = None  # the endpoint's conversations, with --serve
        self.reading = False  # the ring is up and requests are read: a "quit" request ends it cleanly

    # --- called from the UI thread --------------------------------------------------------------------------

    def ask(self, n: int, text: str, opts: AnswerOptions) -> None:
        """`opts`: the chat's options when the prompt was sent (a later /temp applies to the next answer)."""
        self._queue("ask", n, text, opts)

    def load(self, messages: list[dict]) -> None:
        """Start over with these messages (a new chat, or a saved one: the next answer replays them)."""
        self._queue("load", list(messages))

    def check_draft(self, spec: str) -> None:
        """Load the drafter `spec` (a settings word or model) now; DraftChecked says whether it works."""
        self._queue("draft", spec)

    def close(self, timeout: float = 20) -> None:
        """End the ring the way `sfchat host --headless` does (members told bye); cancel only if that hangs."""
        if self.reading and self.thread.is_alive():
            self.stop_answer(math.inf)
            self._queue("quit")
            self.thread.join(min(timeout, 10))
        super().close(timeout)

    def stop_answer(self, n: int) -> None:
        self.stop_upto = max(self.stop_upto, n)  # read between rounds by should_stop; a plain int is thread-safe

    def _queue(self, *request) -> None:
        with self._lock:
            if self._token is None:  # trio has not started yet: main() picks these up first
                self._early.append(request)
                return
        self.call_soon(self._requests.send_nowait, request)

    # --- the trio thread ------------------------------------------------------------------------------------

    def _say(self, *a) -> None:
        self.post(Status(" ".join(str(x) for x in a)))

    def _ring_changed(self) -> None:
        host = self.host
        if host is None or not host.port:
            return
        invite = invite_for(self.opts, host)
        members = host.members_info()
        members[0]["address"] = invite.address
        # a lost member is shown through the re-plan around it, and dropped at the next (when one joins, say)
        for m in members:
            if m["state"] in ("lost", "left"):
                self.lost_at.setdefault(m["id"], host.epoch)
            else:  # a joiner trying again (--stay) keeps its number
                self.lost_at.pop(m["id"], None)
        members = [m for m in members if host.epoch <= self.lost_at.get(m["id"], host.epoch) + 1]
        serving = ""
        if self.serving is not None:
            st = self.serving.status()
            serving = f"{self.serving.url}/v1 · {st['in_flight']} request(s) in flight, {st['waiting']} waiting"
        self.post(RingChanged(members, "\n".join(invite.lines() + [host.planner.how()]), serving))

    async def main(self) -> None:
        with self._lock:  # before any checkpoint, so these stay ahead of requests sent through the token
            for request in self._early:
                self._requests.send_nowait(request)
            self._early.clear()
        opts = self.opts
        self._say("loading the model…")
        self.host = host = build_host(opts, on_change=self._ring_changed)  # the same host as --headless
        host.say = self._say  # its progress lines go to the status line, not to a terminal Textual owns
        if opts.local_peers:
            self._say(f"starting {opts.local_peers} local peer(s)…")
        async with open_ring(opts, host=host, announce=False, stay=True) as ring:
            self.ring = ring
            self.chat = Chat(host, ring.tokenizer, ring.eos, messages=self._first_messages, reuse=opts.prefix_cache)
            self.policy = KPolicy()
            self.drafter, self.draft_spec = None, object()
            await self._use_drafter(opts.answer.draft)
            # with --serve the endpoint answers in this same loop, beside the chat
            async with serving_beside(ring, self.drafter, opts, say=self._say, on_change=self._ring_changed) as conv:
                self.serving = conv
                self._ring_changed()
                self.post(Ready(host.source.name, self.drafter.name))
                self.reading = True
                async for kind, *payload in self._inbox:
                    if kind == "quit":
                        return  # leaves open_ring normally: its members hear "bye" and end as a normal end
                    if kind == "ask":
                        await self._ask(*payload)
                    elif kind == "draft":
                        await self._check_draft(payload[0])
                    elif kind == "load":
                        await host.drop(self.chat.rs)
                        self.chat = Chat(host, ring.tokenizer, ring.eos, messages=payload[0],
                                         reuse=opts.prefix_cache)

    async def _use_drafter(self, spec: str | None) -> None:
        if spec != self.draft_spec:
            old, self.drafter = self.drafter, await new_drafter(spec, self.ring, say=self._say)
            self.draft_spec = spec
            if old is not None:
                await trio.to_thread.run_sync(old.close)  # its compiled graphs and their memory

    async def _check_draft(self, spec: str) -> None:
        try:
            await self._use_drafter(None if spec == "auto" else spec)
        except Exception as e:  # noqa: BLE001 - a drafter that does not load is reported, never saved
            self.post(DraftChecked(spec, describe(e)))
            return
        self.post(DraftChecked(spec, None, self.drafter.name))

    async def _ask(self, n: int, text: str, opts: AnswerOptions) -> None:
        chat = self.chat
        before = len(chat.messages)
        try:
            await self._use_drafter(opts.draft)
            opts.pin(self.policy)

            def on_round(ev: dict) -> None:
                if ev.get("event") == "round":
                    self.post(RoundDone(n, ev))
                elif ev.get("event") == "recovering":
                    self.post(Recovering(n, str(ev.get("error"))))

            answer, result = await chat.reply(text, drafter=self.drafter, params=opts.sampling(), policy=self.policy,
                                              max_new_tokens=opts.max_new_tokens,
                                              on_text=lambda d: self.post(AnswerDelta(n, d)), on_round=on_round,
                                              should_stop=lambda: self.stop_upto >= n)
        except Exception as e:  # a failed answer is reported in the chat; the ring and the app carry on
            log.exception("answer %d failed", n)
            del chat.messages[before:]  # no dangling user turn: the next prompt renders cleanly
            self.post(AnswerFailed(n, describe(e), [dict(m) for m in chat.messages]))
            return
        self.post(AnswerDone(n, answer, result.finish, [dict(m) for m in chat.messages], self.drafter.name,
                             chat.dropped, len(result.token_ids) < opts.max_new_tokens))


class PeerWorker(Worker):
    """`sfchat join`: one Peer in the trio thread, its state posted on every change."""

    name = "sfchat-peer"

    def __init__(self, opts: JoinOptions, post):
        super().__init__(post)
        self.opts = opts

    def _changed(self, st: PeerState) -> None:
        self.post(PeerChanged(dataclasses.replace(st, compute_ms=list(st.compute_ms))))

    async def main(self) -> None:
        # the same life as `sfchat join --headless`, plus the screen's callback
        why = await join_ring(self.opts, say=logging.getLogger("sfchat.join").info, on_change=self._changed)
        self.post(Ended(why))


class UILogHandler(logging.Handler):
    """Log records as messages to the UI (the terminal belongs to Textual; stderr would tear the screen)."""

    def __init__(self, post, level=logging.INFO):
        super().__init__(level)
        self.post = post
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == log.name:  # the UI reports its own failures; these records are for the log file
            return
        try:
            self.post(LogLine(record.levelno, self.format(record)))
        except Exception:  # noqa: BLE001 - logging must never raise into the engine
            pass
