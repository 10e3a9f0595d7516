"""A conversation on the ring: messages rendered with the model's own chat template, streamed as text."""
from __future__ import annotations

import uuid
from functools import partial
from dataclasses import dataclass, field
from pathlib import Path

from transformers import AutoTokenizer, GenerationConfig

from peers.speculation.adaptive import KPolicy
from peers.conversation.context import ContextError, context_limit, fit
from peers.speculation.drafting import Drafter, common_prefix
from peers.speculation.generate import Result, generate
from peers.host.host import Host
from peers.speculation.sampling import SamplingParams


def load_tokenizer(model_dir: Path):
    return AutoTokenizer.from_pretrained(model_dir)


def eos_ids(model_dir: Path, config, tokenizer) -> set[int]:
    ids: set[int] = set()
    try:
        gc = GenerationConfig.from_pretrained(model_dir)
    except OSError:
        gc = GenerationConfig.from_model_config(config)
    for v in (gc.eos_token_id, config.eos_token_id, tokenizer.eos_token_id):
        if v is not None:
            ids.update(v if isinstance(v, list) else [v])
    return ids


def render(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """The model's chat template over the messages (and the tools it may call), generation prompt added; no system
    prompt of ours."""
    out = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if not isinstance(out, list) else out)


class TextStream:
    """Turns a growing list of ids into text increments, holding back a half-decoded character."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.text = tokenizer, [], ""

    def push(self, new: list[int]) -> str:
        self.ids += new
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""
        delta, self.text = text[len(self.text):], text
        return delta


@dataclass
class Chat:
    host: Host
    tokenizer: object
    eos: set[int]
    messages: list[dict] = field(default_factory=list)
    sid: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    tokens: list[int] = field(default_factory=list)
    dropped: int = 0  # oldest turns the last reply dropped to fit the context
    reuse: bool = True  # False (--no-prefix-cache): every turn reads the whole conversation again

    def __post_init__(self):
        self.rs = self.host.new_session(self.sid)

    async def reply(self, user_text: str, *, drafter: Drafter, params: SamplingParams, policy: KPolicy,
                    max_new_tokens: int, on_text=None, on_round=None, should_stop=None) -> tuple[str, Result]:
        self.messages.append({"role": "user", "content": user_text})
        model_limit = context_limit(self.host.config)
        limit = min(model_limit, self.host.max_context)
        try:
            prompt, self.dropped, max_new_tokens = fit(partial(render, self.tokenizer), self.messages, limit,
                                                       max_new_tokens)
        except ContextError as e:
            self.messages.pop()  # refused: the conversation stays as it was
            if limit < model_limit:  # the ring made room for less than the model takes
                raise ContextError(e.tokens, e.limit, e.answer, "the ring's context (--max-context)",
                                   f", or start the host with a larger --max-context (up to {model_limit:,})") from None
            raise
        # keep the ring's caches for the part of the conversation that renders the same as what it holds
        common = common_prefix(prompt, self.tokens) if self.reuse else 0
        self.rs.set_position(min(self.rs.ring_len, common, len(prompt) - 1), len(prompt))
        self.tokens = prompt
        stream = TextStream(self.tokenizer)

        def round_cb(ev: dict) -> None:
            if ev.get("event") == "round" and on_text is not None:
                if delta := stream.push(ev["new"]):
                    on_text(delta)
            if on_round is not None:
                on_round(ev)

        result = await generate(self.host, self.rs, self.tokens, drafter=drafter, params=params, policy=policy,
                                max_new_tokens=max_new_tokens, eos=self.eos, on_round=round_cb,
                                should_stop=should_stop)
        text = self.tokenizer.decode(result.token_ids, skip_special_tokens=True)
        self.messages.append({"role": "assistant", "content": text})
        return text, result
