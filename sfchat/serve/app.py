"""The OpenAI-compatible routes: chat completions, responses, the model list, the ring's health and metrics."""
from __future__ import annotations

import logging
from functools import partial

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .auth import check_key
from .completion import CompletionResponse
from .conversations import Conversations
from .errors import ApiError
from .health import Health
from .metrics import CONTENT_TYPE, Counting, Metrics
from .legacy import TextStream, parse_legacy
from .request import parse
from .responses import ResponseStream, parse_responses

log = logging.getLogger("sfchat.serve")
MAX_BODY = 4 * 2**20  # a chat that fills any context we serve is far smaller
MAX_DRAIN = 64 * 2**20
SERVED = ("POST /v1/chat/completions", "POST /v1/responses", "POST /v1/completions", "GET /v1/models",
          "GET /v1/models/{model}", "GET /health", "GET /metrics")  # what an unknown route's 404 lists


def model_id(host) -> str:
    """The name clients ask for: the hub id, or the model directory's name (a .gguf: the converted one's)."""
    return host.source.name


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


async def read_body(request: Request) -> bytes:
    """The body, up to MAX_BODY. One beyond that is read on and thrown away (a client that is still sending would
    miss our answer if we closed on it) up to MAX_DRAIN, past which the connection is simply dropped."""
    body, seen = bytearray(), 0
    async for piece in request.stream():
        seen += len(piece)
        if seen <= MAX_BODY:
            body += piece
        elif seen > MAX_DRAIN:
            break
    if seen > MAX_BODY:
        raise ApiError(413, f"the request body is over {MAX_BODY // 2**20} MiB")
    return bytes(body)


def build_app(conversations: Conversations, *, api_key: str | None = None, keepalive_s: float = 10.0,
              strict_model: bool = False) -> Starlette:
    """strict_model: a request naming another model is a 404 (else it is answered by the one model served)."""
    host = conversations.host
    name = model_id(host)
    names = {name, host.model_spec, host.model_dir.name}
    ignored: set[str] = set()  # other names asked for, each said once in the log
    ring_health = Health(host)
    metrics = Metrics(host, ring_health)

    async def chat_completions(request: Request):
        check_key(request.headers.get("authorization"), api_key)
        req = parse(await read_body(request))
        check_model(req.model)
        job = conversations.prepare(req)
        await conversations.ring_ready()
        return CompletionResponse(conversations, job, name, keepalive_s, metrics=metrics)

    async def completions(request: Request):
        """The legacy endpoint: a raw prompt, no chat template (sfchat/serve/legacy.py)."""
        check_key(request.headers.get("authorization"), api_key)
        req, text = parse_legacy(await read_body(request))
        check_model(req.model)
        job = conversations.prepare(req, text)
        await conversations.ring_ready()
        return CompletionResponse(conversations, job, name, keepalive_s, shape=TextStream, prefix="cmpl-",
                                  metrics=metrics)

    async def responses(request: Request):
        """The Responses API (sfchat/serve/responses.py), answered as a chat completion."""
        check_key(request.headers.get("authorization"), api_key)
        req = parse_responses(await read_body(request))
        check_model(req.model)
        job = conversations.prepare(req)
        await conversations.ring_ready()
        return CompletionResponse(conversations, job, name, keepalive_s, shape=partial(ResponseStream, request=req),
                                  prefix="resp_", metrics=metrics)

    def check_model(asked: str) -> None:
        """One model is served: any name gets it (as llama-server), unless --strict-model."""
        if asked in names:
            return
        if strict_model:
            raise ApiError(404, f"the model '{asked}' does not exist; this ring serves '{name}'",
                           param="model", code="model_not_found")
        if asked not in ignored:
            ignored.add(asked)
            log.info("a request asked for the model '%s': answered by %s, the one served", asked, name)

    card = {"id": name, "object": "model", "created": 0, "owned_by": "sfchat"}

    async def models(request: Request):
        check_key(request.headers.get("authorization"), api_key)
        return JSONResponse({"object": "list", "data": [card]})

    async def one_model(request: Request):
        check_key(request.headers.get("authorization"), api_key)
        if (asked := request.path_params["model"]) not in names:  # (a card names one model: no other is listed)
            raise ApiError(404, f"the model '{asked}' does not exist; this ring serves '{name}'",
                           param="model", code="model_not_found")
        return JSONResponse(card)

    async def health(request: Request):
        """Open, as health checks are; the members (their addresses and memory) only with the key. A 503 unless
        the ring can answer now (sfchat/serve/health.py): a readiness probe takes the server out meanwhile."""
        body = ring_health.now() | {"model": name, "epoch": host.epoch, "conversations": conversations.status(),
                                    "passes": {"batches": host.batcher.batches, "rounds": host.batcher.rounds}}
        try:
            check_key(request.headers.get("authorization"), api_key)
            body["members"] = host.members_info()
        except ApiError:
            pass
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    async def scrape(request: Request):
        check_key(request.headers.get("authorization"), api_key)
        return Response(metrics.text(), media_type=CONTENT_TYPE)

    async def api_error(request: Request, e: ApiError):
        return error_response(e)

    async def http_error(request: Request, e: HTTPException):
        if e.status_code == 405:
            return error_response(ApiError(405, f"{request.method} is not allowed on {request.url.path}"))
        if e.status_code == 404:  # an endpoint we do not serve (/v1/embeddings, say): name those we do
            return error_response(ApiError(404, f"{request.url.path} is not served here; this server serves "
                                                f"{', '.join(SERVED)}", code="unknown_route"))
        return error_response(ApiError(e.status_code, e.detail or "error"))

    async def gone(request: Request, e: ClientDisconnect):
        """A client that hung up mid-body: nobody is left to answer, and nothing went wrong here."""
        log.info("a client hung up before its request's body was complete")
        return error_response(ApiError(400, "the request's body ended early"))

    async def server_error(request: Request, e: Exception):
        log.exception("request failed")
        return error_response(ApiError(500, f"internal error: {type(e).__name__}"))

    app = Starlette(routes=[Route("/v1/chat/completions", chat_completions, methods=["POST"]),
                            Route("/v1/responses", responses, methods=["POST"]),
                            Route("/v1/completions", completions, methods=["POST"]),
                            Route("/v1/models", models, methods=["GET"]),
                            Route("/v1/models/{model:path}", one_model, methods=["GET"]),
                            Route("/health", health, methods=["GET"]),
                            Route("/metrics", scrape, methods=["GET"])],
                    exception_handlers={ApiError: api_error, HTTPException: http_error, ClientDisconnect: gone,
                                        Exception: server_error})
    return Counting(app, metrics, tuple(s.split()[1] for s in SERVED))
