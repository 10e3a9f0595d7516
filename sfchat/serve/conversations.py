"""Completions on the ring: each request is a conversation of its own (its caches on every member, its own
drafter state), admitted first come, first served up to a limit. A finished answer's caches stay on every member
as a warm row (peers/conversation/warm_rows.py): a request that resends the conversation (a chat's next turn, an
agent's next call) takes the row sharing its longest prefix and the ring computes only the rest. A cancelled
answer's (a client that went away) are dropped on every member at once."""
from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field

import trio

from peers import KPolicy
from peers import TextStream, render
from peers import context_limit
from peers import Drafter
from peers import RingError
from peers import generate
from peers import SamplingParams
from peers import Grammar, GrammarError, json_grammar, lark_grammar
from peers import WarmRows

from sfchat.options import AnswerOptions

from .errors import ApiError
from .request import ChatRequest
from .stops import StopFilter
from . import generic_tools as generic
from .tools import OPEN, split_calls, template_messages, tool_format

log = logging.getLogger("sfchat.serve")


@dataclass
class Job:
    request: ChatRequest
    prompt: list[int]
    max_new: int
    params: SamplingParams
    grammar: str | None = None  # what the answer must follow (response_format, a required call), for llguidance
    tool_format: str | None = None  # native or generic (sfchat/serve/tools.py); None: no tools shown
    arrived: float = field(default_factory=time.monotonic)  # for /metrics: the time to its first token
    first_token: float | None = None


@dataclass
class Outcome:
    finish: str  # stop, length, tool_calls
    completion_tokens: int
    stats: dict = field(default_factory=dict)
    tool_calls: list[dict] | None = None  # OpenAI's shape, arguments as JSON text
    cached_tokens: int = 0  # prompt tokens the ring already held (a warm row's): usage.prompt_tokens_details


class Conversations:
    def __init__(self, host, tokenizer, eos: set[int], drafter: Drafter, *, limit: int | None = None,
                 replan_wait_s: float = 30.0, on_change=None, answer: AnswerOptions = AnswerOptions(),
                 prefix_cache: bool = True, reserved: int = 0):
        """prefix_cache False (--no-prefix-cache): no warm rows, every request from scratch. reserved: arena rows
        another conversation keeps (the TUI's chat beside `host --serve`), left out of the warm rows."""
        self.host, self.tokenizer, self.eos, self.drafter = host, tokenizer, eos, drafter
        self.answer = answer  # the server's sampling, for what a request leaves out
        self.policy = KPolicy()  # pass costs are the ring's, whichever conversation measured them
        self.limit = limit or host.conversations  # the rows every member's KV arena was planned with (4 by default)
        self.admission = trio.CapacityLimiter(self.limit)  # wakes waiters in FIFO order
        self.waiting = 0
        self.open: dict[str, int] = {}  # conversation id -> tokens generated so far
        self.replan_wait_s = replan_wait_s
        self.url = ""  # where it is served, once it is
        self.on_change = on_change or (lambda: None)
        self.context = min(context_limit(host.config), host.max_context)  # what the ring's caches were planned for
        self.tool_format = tool_format(tokenizer, host.source.name)  # said once in the log
        # as many rows as every member's arena has besides the reserved ones: no member ever evicts a warm row
        self.warm = WarmRows(host, drafter, max(host.conversations - reserved, 0) if prefix_cache else 0)

    def prepare(self, req: ChatRequest, text: str | None = None) -> Job:
        """Render and check the request before any answer starts (400 context_length_exceeded: no room left).
        text: a legacy completion's prompt, tokenized as it is (no chat template)."""
        fmt = self.tool_format if req.tools is not None and req.tools.choice != "none" else None
        if fmt == "generic":  # the tools in a system message of ours, shown to a template that takes none
            messages, shown = generic.messages(req.messages, req.tools), None
        else:
            messages, shown = template_messages(req.messages), req.tools.for_template() if req.tools else None
        try:
            prompt = render(self.tokenizer, messages, shown) if text is None else self.tokenizer(text)["input_ids"]
        except ApiError:
            raise
        except Exception as e:  # a template that rejects the message order, for one
            raise ApiError(400, f"the model's chat template rejects these messages: {e}", param="messages") from None
        if not prompt:
            raise ApiError(400, "the prompt is empty", param="prompt")
        room = self.context - len(prompt)
        if room < 1:
            raise ApiError(400, f"the prompt is {len(prompt)} tokens; the model's context holds {self.context}",
                           param="messages" if text is None else "prompt", code="context_length_exceeded")
        if req.max_tokens is not None and req.max_tokens > room:  # as OpenAI's API: refused, not silently cut
            raise ApiError(400, f"'{req.max_tokens_param}' is {req.max_tokens}, but the context holds {self.context} "
                           f"tokens and the prompt takes {len(prompt)}: {room} are left for the answer",
                           param=req.max_tokens_param, code="context_length_exceeded")
        temperature = self.answer.temperature if req.temperature is None else req.temperature
        top_p = self.answer.top_p if req.top_p is None else req.top_p
        greedy = temperature == 0 or top_p == 0
        params = SamplingParams(0.0 if greedy else temperature, self.answer.top_k, 1.0 if greedy else top_p,
                                self.answer.seed if req.seed is None else req.seed, logprobs=req.top_logprobs)
        return Job(req, prompt, req.max_tokens or room, params, self._grammar(req, fmt), fmt)

    @staticmethod
    def _grammar(req: ChatRequest, fmt: str | None) -> str | None:
        """What the answer must follow: response_format's JSON, or a call of one of the tools (generic: the
        answer is JSON, a call or a reply, even under auto)."""
        call = req.tools.lark() if fmt == "native" else None
        if (call is not None or fmt == "generic") and req.json_schema is not None:
            why = "a required tool call" if fmt == "native" else "tools in the generic format (this model's)"
            raise ApiError(400, f"{why} and response_format cannot both shape one answer",
                           param="tool_choice" if fmt == "native" else "response_format")
        try:
            if fmt == "generic":
                return json_grammar(generic.schema(req.tools))
            if call is not None:
                return lark_grammar(call)
            return json_grammar(req.json_schema) if req.json_schema is not None else None
        except GrammarError as e:
            param = "tools" if call is not None else "response_format"
            raise ApiError(400, f"{param}: this JSON schema cannot be followed: {e}", param=param) from None

    async def ring_ready(self) -> None:
        """Wait out a re-plan in progress; 503 if it takes longer than replan_wait_s."""
        with trio.move_on_after(self.replan_wait_s):
            while self.host.replanning:
                await trio.sleep(0.1)
            return
        raise ApiError(503, "the ring is re-planning (a member joined or was lost); try again shortly",
                       code="ring_replanning")

    def _entries(self, lps) -> list[dict]:
        """OpenAI's logprobs entries; an end-of-sequence token is not part of the text, so not of them either."""
        def one(token: int, logprob: float) -> dict:
            s = self.tokenizer.decode([token])
            return {"token": s, "logprob": logprob, "bytes": list(s.encode())}
        return [one(e.token, e.logprob) | {"top_logprobs": [one(t, v) for t, v in e.top]}
                for e in lps if e.token not in self.eos]

    def status(self) -> dict:
        return {"in_flight": len(self.open), "waiting": self.waiting, "max": self.limit, "warm": self.warm.status()}

    async def run(self, job: Job, emit) -> Outcome:
        """Generate the answer, calling emit(text, logprobs) with each piece safe to send and the OpenAI logprobs
        entries of the tokens decided since the last piece (None when the request asked for none)."""
        self.waiting += 1
        self.on_change()
        try:
            await self.admission.acquire()
        finally:
            self.waiting -= 1
        tokens = list(job.prompt)  # (the answer's tokens are added as they are made)
        taken = self.warm.take(tokens, job.request.cache_prompt)
        rs, finished = taken.row.rs, False
        self.open[rs.sid] = 0
        self.on_change()
        try:
            outcome = await self._generate(job, rs, taken.row.drafter, tokens, emit)
            outcome.cached_tokens, finished = taken.cached, True
            return outcome
        finally:
            del self.open[rs.sid]
            self.admission.release()
            self.on_change()
            with trio.CancelScope(shield=True):  # a cancelled answer frees its caches on every member
                await self.warm.give_back(taken.row, tokens, finished)

    async def _generate(self, job: Job, rs, drafter: Drafter, tokens: list[int], emit) -> Outcome:
        text, stops = TextStream(self.tokenizer), StopFilter(job.request.stop)
        # a call's text is held back from the first <tool_call>: it goes out as tool_calls if it parses; the
        # generic format's whole answer is JSON, read once it is complete
        calls = Held() if job.tool_format == "generic" else StopFilter((OPEN,) if job.tool_format else ())
        want = job.params.logprobs is not None
        held: list[dict] = []  # logprobs entries not sent yet: they go with the next piece of text

        def out(piece: str) -> None:
            emit(piece, held[:] if want else None)
            held.clear()

        def on_round(ev: dict) -> None:
            if ev.get("event") == "round":
                if job.first_token is None and ev["new"]:
                    job.first_token = time.monotonic()
                self.open[rs.sid] += len(ev["new"])
                held.extend(self._entries(ev["logprobs"]))
                if piece := stops.push(calls.push(text.push(ev["new"]))):
                    out(piece)

        if job.grammar is not None:  # (the first one reads the tokenizer's vocabulary: a second, off the loop)
            job.params.grammar = await trio.to_thread.run_sync(Grammar, self.tokenizer, job.grammar,
                                                               self.host.config.vocab_size)
        try:  # (the row's drafter: a fork of the server's, its state following the row's tokens)
            result = await generate(self.host, rs, tokens, drafter=drafter, params=job.params,
                                    policy=self.policy, max_new_tokens=job.max_new, eos=self.eos, on_round=on_round,
                                    should_stop=lambda: stops.hit)
        except RingError as e:
            raise ApiError(503, f"the ring failed: {e}", code="ring_failed") from None
        # what the stream held back (a character half decoded when the answer ended) goes out as the full decode has it
        full = self.tokenizer.decode(result.token_ids, skip_special_tokens=True)
        tail = calls.push(full[len(text.text):])
        if job.tool_format == "generic":
            found = generic.read(full)
            tail = found[0] if found else full  # the reply's text, or (cut short: no JSON) what the model wrote
        else:
            found = split_calls(full) if calls.hit else None
            if not found:  # no call, or text that is none after all: it is the answer's text
                tail += calls.flush() + (full[full.index(OPEN):] if calls.hit else "")
        if found and found[1] and not job.request.tools.parallel:
            found = found[0], found[1][:1]  # one call unless parallel_tool_calls (a native template's may be more)
        if (tail := stops.push(tail) + stops.flush()) or held:
            out(tail)
        s = result.stats.summary()
        stats = {k: s[k] for k in ("tokens_per_round", "acceptance", "tokens_per_second", "rounds", "drafted",
                                   "accepted")} | {"drafter": self.drafter.name}
        if found and found[1]:
            return Outcome("tool_calls", len(result.token_ids), stats, found[1])
        return Outcome("length" if result.finish == "length" and not stops.hit else "stop", len(result.token_ids),
                       stats)


class Held:
    """Holds all the text back (the generic format's answer is read whole); the StopFilter's face."""
    hit = False

    def push(self, text: str) -> str:
        return ""
