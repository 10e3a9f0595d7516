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
        async with trio.open_nursery() as nursery:
            if args.serve:
                from .serve.command import start

                conv, url = await start(nursery, ring, drafter, args)
                say(f"serving {host.model_dir.name} at {url}/v1 (up to {conv.limit} conversations at once)")
            await _prompts(args, chat, drafter, policy)
            nursery.cancel_scope.cancel()
        return 0


async def _prompts(args, chat: Chat, drafter, policy: KPolicy) -> None:
    while True:
        sys.stderr.write("> ")
        sys.stderr.flush()
        line = await trio.to_thread.run_sync(sys.stdin.readline)
        if not line:
            return
        if not line.strip():
            continue
        params = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
        await chat.reply(line.strip(), drafter=drafter, params=params, policy=policy,
                         max_new_tokens=args.max_new_tokens,
                         on_text=lambda d: (sys.stdout.write(d), sys.stdout.flush()))
        print()
