"""`sfchat ask`: one prompt, one answer, streamed to stdout (or one JSON object with --json)."""
from __future__ import annotations

import json
import sys

from peers import KPolicy
from peers import Chat

from .options import AnswerOptions, RingOptions
from .runtime import Ring, new_drafter, open_ring, say

MEMBER_KEYS = ("name", "state", "layers", "rtt_ms", "device", "memory_bytes", "peak_memory_bytes")


async def ask(prompt: str, opts: RingOptions, as_json: bool = False) -> int:
    def on_text(delta: str) -> None:
        if not as_json:
            sys.stdout.write(delta)
            sys.stdout.flush()

    async with open_ring(opts) as ring:
        doc = await answer(ring, prompt, opts.answer, on_text)
    if as_json:
        print(json.dumps(doc, ensure_ascii=False))
    else:
        print()
    if doc["stats"]["finish"] == "length":
        say(length_note(opts.answer.max_new_tokens, len(doc["token_ids"])))
    return 0


async def answer(ring: Ring, prompt: str, opts: AnswerOptions, on_text=None) -> dict:
    """One answer on a ring that is up, in a conversation of its own that every member frees after (a ring may
    answer many): what `ask --json` prints, {"text", "token_ids", "stats"}."""
    drafter = await new_drafter(opts.draft, ring)
    chat = Chat(ring.host, ring.tokenizer, ring.eos)
    text, result = await chat.reply(prompt, drafter=drafter, params=opts.sampling(), policy=opts.pin(KPolicy()),
                                    max_new_tokens=opts.max_new_tokens, on_text=on_text)
    members = [{k: m[k] for k in MEMBER_KEYS} for m in ring.host.members_info()]
    await ring.host.drop(chat.rs)
    stats = result.stats.summary() | {"members": members, "finish": result.finish, "drafter": drafter.name,
                                      "per_round": result.rounds}
    return {"text": text, "token_ids": result.token_ids, "stats": stats}


def length_note(max_new_tokens: int, n: int) -> str:
    if n < max_new_tokens:  # the context window, not the setting, ended it
        return f"(the answer was cut after {n} tokens: the model's context is full; start a shorter conversation)"
    return f"(the answer was cut at the length limit, {max_new_tokens} tokens; raise it with --max-new-tokens)"
