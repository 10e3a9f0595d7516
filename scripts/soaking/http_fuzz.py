"""Bad HTTP on the endpoint: malformed bodies, wrong fields, wrong keys, slow bodies, bodies that stop mid-way,
and clients that go away mid-stream. A complete bad request must get an error in OpenAI's shape; none may hang."""
from __future__ import annotations

import asyncio
import json
import os
import random
import time

from .tally import Tally

ANSWER_S = 60.0  # a complete request not answered by then is improper (a busy ring answers bad ones at once)


def request(port: int, body: bytes, *, key: str | None, method: str = "POST", path: str = "/v1/chat/completions",
            length: int | None = None) -> bytes:
    head = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Type: application/json",
            f"Content-Length: {len(body) if length is None else length}", "Connection: close"]
    if key is not None:
        head.append(f"Authorization: Bearer {key}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def bad_body(rng: random.Random, model: str) -> bytes:
    good = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
    wrong = rng.choice([
        {"messages": "hi"}, {"messages": []}, {"messages": [{"role": "wizard", "content": "x"}]},
        {"messages": [{"role": "user", "content": 5}]},
        {"messages": [{"role": "user", "content": [{"type": "image"}]}]},
        {"max_tokens": -1}, {"max_tokens": "many"}, {"temperature": "hot"}, {"temperature": 1e9},
        {"top_p": -2}, {"model": 5}, {"stop": ["a", "b", "c", "d", "e"]}, {"stream": "yes"},
        {"messages": [{"role": "user", "content": "x" * 200000}]}, {"seed": 1.5}, {"n": 3},
    ])
    if rng.random() < 0.3:  # not even JSON, or not an object
        return rng.choice([b"{", b"[1,2,3]", b"null", os.urandom(64), b'{"model": "x", "messages": [', b"\xff\xfe"])
    return json.dumps(good | wrong).encode()


async def exchange(port: int, data: bytes, *, slow: bool = False, stop_after: int | None = None) -> bytes | None:
    """Send `data` (slowly, in pieces; or only its first stop_after bytes, then hang up) and read the reply."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if stop_after is not None:
            writer.write(data[:stop_after])
            await writer.drain()
            return None
        if slow:
            for i in range(0, len(data), max(len(data) // 8, 1)):
                writer.write(data[i:i + max(len(data) // 8, 1)])
                await writer.drain()
                await asyncio.sleep(0.3)
        else:
            writer.write(data)
            await writer.drain()
        async with asyncio.timeout(ANSWER_S):
            return await reader.read()
    finally:
        writer.close()


def openai_error(reply: bytes) -> bool:
    """A 4xx/5xx whose body is {"error": {"message": …, "type": …}}."""
    head, _, body = reply.partition(b"\r\n\r\n")
    try:
        status = int(head.split(b" ", 2)[1])
        err = json.loads(body)["error"]
        return status >= 400 and isinstance(err["message"], str) and isinstance(err["type"], str)
    except (ValueError, IndexError, KeyError, TypeError):
        return False


async def one_bad(port: int, key: str, model: str, rng: random.Random, tally: Tally) -> None:
    kind = rng.randrange(10)
    body = bad_body(rng, model)
    key_sent = key if kind else rng.choice([None, "wrong-key", key + "x"])
    if kind == 0:  # a wrong key with an otherwise good request
        body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}).encode()
    tally.http_bad += 1
    try:
        if kind == 1:  # a body that stops mid-way
            data = request(port, body, key=key, length=len(body) + 100)
            await exchange(port, data, stop_after=len(data) - rng.randrange(0, len(body) + 1))
            return
        if kind == 2:  # a huge length announced, a little sent, gone
            await exchange(port, request(port, body, key=key, length=rng.choice([10**7, 10**10])), stop_after=400)
            return
        if kind == 3:  # not HTTP at all
            await exchange(port, os.urandom(rng.randrange(1, 2048)) + b"\r\n\r\n", stop_after=10**6)
            return
        if kind == 4:  # a wrong method or route
            reply = await exchange(port, request(port, b"", key=key, method=rng.choice(["GET", "PUT", "DELETE"])))
        else:
            reply = await exchange(port, request(port, body, key=key_sent), slow=kind == 5)
        if not openai_error(reply or b""):
            tally.http_improper += 1
            tally.note(f"bad request {body[:80]!r} (key {key_sent!r}) answered {(reply or b'')[:200]!r}")
    except TimeoutError:
        tally.http_improper += 1
        tally.note(f"bad request {body[:80]!r} not answered in {ANSWER_S:.0f} s")
    except (ConnectionError, OSError):
        pass  # it hung up on us: fine for bytes that are not a request


async def gone_mid_stream(port: int, key: str, model: str, tally: Tally) -> None:
    """Start a streamed answer, read its first event, hang up."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "tell me a long story"}],
                       "max_tokens": 64, "temperature": 0, "stream": True}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request(port, body, key=key))
        await writer.drain()
        async with asyncio.timeout(ANSWER_S):
            while line := await reader.readline():
                if line.startswith(b"data: {"):
                    tally.disconnects += 1
                    return
    except (TimeoutError, ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def run(port: int, key: str, model: str, deadline: float, rate: float, tally: Tally, seed: int = 2) -> None:
    """About `rate` bad requests a second (a few at once), and every tenth time a client gone mid-stream."""
    rng = random.Random(seed)
    pending: set[asyncio.Task] = set()
    async with asyncio.TaskGroup() as tg:
        n = 0
        while time.monotonic() < deadline:
            pending = {t for t in pending if not t.done()}
            if len(pending) < 4:
                n += 1
                pending.add(tg.create_task(gone_mid_stream(port, key, model, tally) if n % 10 == 0 else
                                           one_bad(port, key, model, rng, tally)))
            await asyncio.sleep(1 / rate)
