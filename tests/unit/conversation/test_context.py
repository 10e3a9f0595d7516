"""Fitting a conversation into the context: whole turns dropped oldest first, the system prompt kept, a prompt
that cannot fit refused with its numbers (the end-to-end checks are in test_cli.py and test_tui.py)."""
from __future__ import annotations

import pytest

from peers.conversation.context import ContextError, fit


def render(messages):  # 100 tokens a message, like a template would give
    return [len(m["content"]) for m in messages for _ in range(100)]


def chat(*roles):
    return [{"role": r, "content": f"{r}{i}"} for i, r in enumerate(roles)]


def test_whole_turns_go_oldest_first_and_the_system_prompt_stays():
    msgs = chat("system", "user", "assistant", "user", "assistant", "user")
    prompt, dropped, answer = fit(render, msgs, 500, 100)  # 600 tokens, 64 wanted for the answer
    assert dropped == 2 and len(prompt) == 400  # system, then the latest turn and the question
    assert answer == 100 and len(msgs) == 6  # the chat itself is left whole
    _, dropped, answer = fit(render, msgs, 10_000, 256)
    assert dropped == 0 and answer == 256


def test_the_answer_gets_what_is_left_but_a_prompt_that_cannot_fit_is_refused():
    _, dropped, answer = fit(render, chat("user"), 200, 256)
    assert dropped == 0 and answer == 100  # room for MIN_ANSWER or more: it runs, cut by the context
    with pytest.raises(ContextError) as e:
        fit(render, chat("system", "user"), 250, 256)
    assert str(e.value) == ("the prompt is 200 tokens but the model's context holds 250 (with 64 left for the "
                            "answer): shorten it or split it into parts")
