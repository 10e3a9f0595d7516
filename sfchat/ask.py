"""`sfchat ask`: one prompt, one answer, streamed to stdout (or one JSON object with --json)."""
from __future__ import annotations

import json
import sys

from peers.adaptive import KPolicy
from peers.chat import Chat
from peers.sampling import SamplingParams

from .runtime import drafter_for, open_ring, say


async def ask(args) -> int:
    params = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
    async with open_ring(args, wait_peers=args.wait_peers) as ring:
        drafter = drafter_for(args, ring)
        chat = Chat(ring.host, ring.tokenizer, ring.eos)

        def on_text(delta: str) -> None:
            if not args.json:
                sys.stdout.write(delta)
                sys.stdout.flush()

        text, result = await chat.reply(args.prompt, drafter=drafter, params=params, policy=KPolicy(pinned=args.k),
                                        max_new_tokens=args.max_new_tokens, on_text=on_text)
        members = [{"name": m["name"], "layers": m["layers"], "rtt_ms": m["rtt_ms"], "device": m["device"],
                    "memory_bytes": m["memory_bytes"], "peak_memory_bytes": m["peak_memory_bytes"]}
                   for m in ring.host.members_info()]
    if args.json:
        stats = result.stats.summary() | {"members": members, "finish": result.finish, "drafter": drafter.name,
                                          "per_round": result.rounds}
        print(json.dumps({"text": text, "token_ids": result.token_ids, "stats": stats}, ensure_ascii=False))
    else:
        print()
    if result.finish == "length":
        say(length_note(args.max_new_tokens, len(result.token_ids)))
    return 0


def length_note(max_new_tokens: int, n: int) -> str:
    if n < max_new_tokens:  # the context window, not the setting, ended it
        return f"(the answer was cut after {n} tokens: the model's context is full; start a shorter conversation)"
    return f"(the answer was cut at the length limit, {max_new_tokens} tokens; raise it with --max-new-tokens)"
