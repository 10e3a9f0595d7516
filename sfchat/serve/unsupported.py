"""What OpenAI's chat API has and sfchat does not do: refused with a 400 that names the parameter, never silently
ignored (a client that relies on one must learn at once that it did nothing).

A parameter is refused only when it asks for something: a value that means "the default" (null, n=1, an empty
logit_bias, parallel_tool_calls, store false...) passes, as OpenAI itself would answer it the same."""
from __future__ import annotations

from .errors import ApiError

# parameter -> why it is refused; a value in NEUTRAL[parameter] (or None) passes
UNSUPPORTED = {
    "logit_bias": "token biases are not supported",
    "audio": "audio output is not supported",
    "modalities": "only text output is supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "functions": "the deprecated 'functions' are not supported; use 'tools'",
    "function_call": "the deprecated 'function_call' is not supported; use 'tool_choice'",
    "presence_penalty": "presence_penalty is not supported",
    "frequency_penalty": "frequency_penalty is not supported",
    "reasoning_effort": "this model has no reasoning effort to set",
    "service_tier": "service tiers are not supported",
    "store": "stored completions are not supported",
    "metadata": "stored completions' metadata is not supported",
    "suffix": "suffix (fill in the middle) is not supported",
    "best_of": "best_of is not supported",
    "echo": "echo is not supported",
}
NEUTRAL = {"logit_bias": ({},), "modalities": (["text"],), "presence_penalty": (0, 0.0),
           "frequency_penalty": (0, 0.0), "store": (False,), "metadata": ({},), "service_tier": ("auto", "default"),
           "suffix": ("",), "best_of": (1,), "echo": (False,)}


def refuse_unsupported(body: dict) -> None:
    """400 naming the first parameter of `body` that asks for something sfchat does not do."""
    if (n := body.get("n")) is not None and n != 1:
        raise ApiError(400, "only n=1 is supported", param="n")
    for key, why in UNSUPPORTED.items():
        v = body.get(key)
        if v is not None and v not in NEUTRAL.get(key, ()):
            raise ApiError(400, f"'{key}': {why}", param=key, code="unsupported_parameter")
