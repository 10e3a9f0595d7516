"""The endpoint served by Hypercorn's trio worker in the host's own event loop (no second loop, no threads)."""
from __future__ import annotations

import logging

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from peers import parse_addr

from .access import AccessLog
from .app import build_app
from .auth import check_exposure
from .conversations import Conversations

DEFAULT_LISTEN = "127.0.0.1:8000"


async def serve_api(conversations: Conversations, listen: str = DEFAULT_LISTEN, *, api_key: str | None = None,
                    insecure_no_key: bool = False, keepalive_s: float = 10.0,
                    strict_model: bool = False, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve until cancelled; task_status gets the bound URL (port 0 picks a free one)."""
    host, port = parse_addr(listen)
    check_exposure(host, api_key, insecure_no_key)
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("sfchat.serve.http")
    config.keep_alive_timeout = 75  # clients reuse connections between requests
    app = AccessLog(build_app(conversations, api_key=api_key, keepalive_s=keepalive_s,
                                     strict_model=strict_model))
    await serve(app, config, shutdown_trigger=trio.sleep_forever, task_status=task_status)
