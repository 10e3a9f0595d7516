"""`sfchat host --headless`: a plain prompt loop on stdin, for servers and scripts."""
from __future__ import annotations

import sys

import trio

from peers.adaptive import KPolicy
from peers.chat import Chat
from peers.sampling import SamplingParams

from .runtime import build_host, drafter_for, open_ring, say


async def host_repl(args) -> int:
    host = build_host(args)
    async with open_ring(args, host=host) as ring:
        say(f"sfchat host on {host.address}. On each other machine run:\n  {host.invite()}")
        drafter = drafter_for(args, ring)
        chat = Chat(host, ring.tokenizer, ring.eos)
        policy = KPolicy(pinned=args.k)
        while True:
            sys.stderr.write("> ")
            sys.stderr.flush()
            line = await trio.to_thread.run_sync(sys.stdin.readline)
            if not line:
                return 0
            if not line.strip():
                continue
            params = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
            await chat.reply(line.strip(), drafter=drafter, params=params, policy=policy,
                             max_new_tokens=args.max_new_tokens,
                             on_text=lambda d: (sys.stdout.write(d), sys.stdout.flush()))
            print()
