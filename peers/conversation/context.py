"""The model's context window: a conversation must fit in it with room for the answer.

A prompt alone past the window is refused before any compute (the model would only produce noise past its
trained positions). A chat that outgrows it drops its oldest turns, keeping the system prompt, until it fits.
"""
from __future__ import annotations

MIN_ANSWER = 64  # tokens kept free for an answer when dropping turns (fewer if max_new_tokens asks fewer)


class ContextError(ValueError):
    """A prompt that does not fit the context; the message is one line for the user: how long, the limit, what
    to do (`why` names the limit, `fix` adds a remedy)."""

    def __init__(self, tokens: int, limit: int, answer: int, why: str = "the model's context", fix: str = ""):
        super().__init__(f"the prompt is {tokens:,} tokens but {why} holds {limit:,} (with {answer} left for the "
                         f"answer): shorten it or split it into parts{fix}")
        self.tokens, self.limit, self.answer = tokens, limit, answer


def context_limit(config) -> int:
    return int(getattr(config, "max_position_embeddings", 0) or 0) or 1 << 31


def fit(render, messages: list[dict], limit: int, max_new_tokens: int) -> tuple[list[int], int, int]:
    """(prompt ids, messages left out, tokens the answer may take) for render(messages).

    Leaves out the oldest user/assistant messages (a system message stays) until the prompt leaves room for
    min(max_new_tokens, MIN_ANSWER) tokens; the latest user message is never left out. `messages` itself is
    kept whole (the chat as saved and shown)."""
    want = min(max_new_tokens, MIN_ANSWER)
    messages, dropped = list(messages), 0
    prompt = render(messages)
    while len(prompt) + want > limit:
        first = next((i for i, m in enumerate(messages[:-1]) if m["role"] != "system"), None)
        if first is None:
            raise ContextError(len(prompt), limit, want)
        del messages[first]
        dropped += 1
        while first < len(messages) - 1 and messages[first]["role"] == "assistant":  # a turn goes whole
            del messages[first]
            dropped += 1
        prompt = render(messages)
    return prompt, dropped, min(max_new_tokens, limit - len(prompt))
