"""What a ring host and a ring member are started with, each one frozen object (no torch: the CLI builds them
before anything heavy loads). The callbacks a screen passes (say, on_change) are wiring, not options: they stay
arguments of Host and Peer."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HostOptions:
    model: str | None = None  # None: the embedded default
    token: str | None = None  # None: a random one
    listen: str = "127.0.0.1:0"
    device: str | None = None  # None: cuda if present
    dtype: str = "auto"
    quant: str = "auto"
    offer_gb: float | None = None  # the host's own share; None: what is free
    heartbeat_s: float = 0.5
    dead_after_s: float = 2.5  # a member silent this long is lost (never sooner than 5x its p99 pong: roster.py)
    tls: bool = False
    relay: str | None = None  # also reachable through this relay
    max_context: int | None = None  # None: the model's limit, capped
    graphs: bool = True  # CUDA graphs of short passes (a GPU only)
    conversations: int | None = None  # rows of each member's KV arena (--max-conversations); None: the default
    placement: str | None = None  # "speed" or "memory" (peers/plan/placement.py); None: $SFCHAT_PLACEMENT, or speed
    serving: bool = False  # many conversations in flight (sfchat serve): the plan evens out the busiest stage
    must_hold: tuple[str, ...] = ()  # members that hold layers whatever their speed: the --local-peers processes


@dataclass(frozen=True)
class PeerOptions:
    address: str  # the host's HOST:PORT, or relay://…
    token: str
    model: str | None = None  # None: the model the host names
    listen: str = "0.0.0.0:0"
    advertise: str | None = None
    device: str | None = None
    dtype: str = "auto"
    quant: str = "auto"
    offer_gb: float | None = None
    name: str = "peer"
    relay: str | None = None
    tls_pin: str | None = None  # the host's certificate fingerprint from a --tls invite
    graphs: bool = True  # CUDA graphs of short passes (a GPU only)
    threads: int | None = None  # torch's CPU threads (--threads); None: torch's default
    key: str = ""  # one `sfchat join`'s, the same at each of its joins: the host keeps its member number
