"""The load: clients streaming chat completions through the real openai client, each answer checked against its
reference. A failed request must fail with a proper OpenAI error (then it is retried); anything else is lost."""
from __future__ import annotations

import asyncio
import random
import time

import openai

from .tally import Tally

RETRIES = 20  # a request still failing after this many proper errors is lost


async def one_answer(client: openai.AsyncOpenAI, model: str, prompt: str, max_tokens: int,
                     tally: Tally) -> tuple[str, int | None, str | None]:
    """Stream one answer: its text, its completion token count (from usage), its finish reason. When each piece
    of text came is noted (the time from a fault to the next token delivered)."""
    text, tokens, finish = [], None, None
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0,
        stream=True, stream_options={"include_usage": True})
    async for chunk in stream:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        for c in chunk.choices:
            if c.delta.content:
                tally.token_times.append(time.monotonic())
            text.append(c.delta.content or "")
            finish = c.finish_reason or finish
    return "".join(text), tokens, finish


async def client_loop(i: int, url: str, key: str, model: str, refs: dict, max_tokens: int, deadline: float,
                      hang_s: float, tally: Tally, faults, once: bool = False) -> None:
    """Ask prompt after prompt until the deadline (once: one prompt, once); each is retried on a proper error
    until answered or lost."""
    rng = random.Random(i)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=hang_s)
    prompts = list(refs)
    try:
        while once or time.monotonic() < deadline:
            once = False
            if (wait := faults.idle_until - time.monotonic()) > 0:  # an idle spell of the ring
                await asyncio.sleep(wait)
                continue
            prompt = rng.choice(prompts)
            t0 = time.monotonic()
            for attempt in range(RETRIES):
                tally.sent += 1
                try:
                    got = await asyncio.wait_for(one_answer(client, model, prompt, max_tokens, tally), hang_s)
                except openai.APIStatusError as e:  # an HTTP error in OpenAI's shape
                    tally.errors[e.status_code] += 1
                    await asyncio.sleep(0.5 + attempt * 0.5)
                    continue
                except openai.APIError as e:  # an error event in OpenAI's shape, mid-stream
                    if isinstance(e, (openai.APIConnectionError, openai.APITimeoutError)) or not e.message:
                        tally.lost += 1
                        tally.note(f"client {i}: {prompt!r}: {type(e).__name__}: {e}")
                        break
                    tally.errors[f"stream:{(e.body or {}).get('code') if isinstance(e.body, dict) else None}"] += 1
                    await asyncio.sleep(0.5 + attempt * 0.5)
                    continue
                except asyncio.TimeoutError:
                    tally.lost += 1
                    tally.note(f"client {i}: {prompt!r}: no answer in {hang_s:.0f} s")
                    break
                text, tokens, finish = got
                ref = refs[prompt]
                if finish is None:
                    tally.lost += 1
                    tally.note(f"client {i}: {prompt!r}: the stream ended without a finish reason: {text!r}")
                elif text == ref["text"] and tokens == ref["tokens"]:
                    tally.exact += 1
                    t1 = time.monotonic()
                    tally.latency_s.append((t1 - t0, faults.overlapped(t0, t1)))
                else:
                    tally.wrong += 1
                    tally.note(f"client {i}: {prompt!r}: {text!r} ({tokens} tokens), expected {ref['text']!r} "
                               f"({ref['tokens']})")
                break
            else:
                tally.lost += 1
                tally.note(f"client {i}: {prompt!r}: still failing after {RETRIES} tries")
    finally:
        await client.close()
