"""`sfchat ask`: one prompt, one answer, streamed to stdout (or one JSON object with --json)."""
from __future__ import annotations

import json
import sys

from peers.adaptive import KPolicy
from peers.chat import Chat

from .options import RingOptions
from .runtime import new_drafter, open_ring, say


async def ask(prompt: str, opts: RingOptions, as_json: bool = False) -> int:
    answer = opts.answer
    async with open_ring(opts) as ring:
        drafter = await new_drafter(answer.draft, ring)
        chat = Chat(ring.host, ring.tokenizer, ring.eos)

        def on_text(delta: str) -> None:
            if not as_json:
                sys.stdout.write(delta)
                sys.stdout.flush()

        text, result = await chat.reply(prompt, drafter=drafter, params=answer.sampling(),
                                        policy=answer.pin(KPolicy()), max_new_tokens=answer.max_new_tokens,
                                        on_text=on_text)
        keys = ("name", "state", "layers", "rtt_ms", "device", "memory_bytes", "peak_memory_bytes")
        members = [{k: m[k] for k in keys} for m in ring.host.members_info()]
    if as_json:
        stats = result.stats.summary() | {"members": members, "finish": result.finish, "drafter": drafter.name,
                                          "per_round": result.rounds}
        print(json.dumps({"text": text, "token_ids": result.token_ids, "stats": stats}, ensure_ascii=False))
    else:
        print()
    if result.finish == "length":
        say(length_note(answer.max_new_tokens, len(result.token_ids)))
    return 0


def length_note(max_new_tokens: int, n: int) -> str:
    if n < max_new_tokens:  # the context window, not the setting, ended it
        return f"(the answer was cut after {n} tokens: the model's context is full; start a shorter conversation)"
    return f"(the answer was cut at the length limit, {max_new_tokens} tokens; raise it with --max-new-tokens)"
