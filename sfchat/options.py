"""Each role's options as one frozen object, built here once from the command line and the settings file.

The rest of the application reads these, never argparse's namespace: a field that a command lacks has its
default here, in one place. A slash command that changes one setting makes a new object
(`dataclasses.replace`), so an answer already under way keeps the options it started with.
"""
from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field

from peers import HostOptions, PeerOptions
from peers import check_pin

from .local import KEY_ENV, local_name
from .settings import Settings

DEFAULT_TEMPERATURE = 0.0  # greedy, where the model's generation_config names no temperature


@dataclass(frozen=True)
class AnswerOptions:
    """How to answer: sampling, the draft and its length, the longest answer."""

    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    k: int | None = None  # None: adaptive
    tree_nodes: int | None = None  # --tree-nodes N: drafted positions a round (None: by what a pass costs)
    trees: bool = True  # False (--no-trees): drafts in chains
    in_flight: int | None = None  # --in-flight N: rounds of one conversation on the ring at once (None: auto)
    draft: str | None = None  # None: the best known
    max_new_tokens: int = 256

    def sampling(self):
        """The engine's own per-answer type (imported here, late: it brings torch)."""
        from peers import SamplingParams

        return SamplingParams(self.temperature, self.top_k, self.top_p, self.seed)

    def pin(self, policy):
        """The draft policy (peers/speculation/adaptive.py) with what these options pin: --k, --tree-nodes, --no-trees,
        --in-flight."""
        policy.pinned, policy.tree_nodes, policy.trees = self.k, self.tree_nodes, self.trees
        policy.in_flight = self.in_flight
        return policy


@dataclass(frozen=True)
class ServeOptions:
    """The OpenAI-compatible endpoint (`sfchat serve`, `sfchat host --serve`)."""

    listen: str
    api_key: str | None = None
    insecure_no_key: bool = False
    max_conversations: int | None = None  # None: the ring's (4, peers/base/limits.py CONVERSATIONS)
    keep_alive_s: float = 10.0
    strict_model: bool = False  # a request naming another model is a 404 (else the one served answers it)


@dataclass(frozen=True)
class RingOptions:
    """A command that hosts a ring (ask, host, serve): the engine's host, what the application adds around
    it, and how it answers."""

    host: HostOptions = field(default_factory=HostOptions)
    answer: AnswerOptions = field(default_factory=AnswerOptions)
    serve: ServeOptions | None = None  # None: no endpoint
    local_peers: int = 0
    local_cores: tuple[list[int], ...] = ()  # bench --pin: the cores each local peer pins itself to (none: any)
    local_args: tuple[list[str], ...] = ()  # bench --member-*: each local peer's own join flags (threads, dtype…)
    wait_peers: int = 0  # joiners to wait for before the first plan
    advertise: str | None = None  # the address the invite names
    prefix_cache: bool = True  # False (--no-prefix-cache): no caches kept between requests, or a chat's turns


@dataclass(frozen=True)
class JoinOptions:
    """`sfchat join`: the engine's peer, and whether to wait for the host to come back."""

    peer: PeerOptions
    stay: bool = False  # a member that cannot take its layers joins again after retry_s (else it exits)
    retry_s: float = 30.0  # with --stay: how long a member that cannot serve waits before it joins again
    give_up_after: float | None = None  # how long to wait for a host that went away; None: until Ctrl+C


def default_temperature(model: str | None) -> float:
    """One default for ask, host and serve: the model's generation_config (as vLLM does), else greedy."""
    from peers.models import generation_temperature

    t = generation_temperature(model)
    return DEFAULT_TEMPERATURE if t is None else t


def answer_options(args, s: Settings | None = None) -> AnswerOptions:
    """With the settings file `s` (sfchat host), what the command line leaves unset (None) comes from it."""
    a = vars(args)

    def flag_or(key: str, setting):
        return a[key] if a.get(key) is not None else setting

    temperature = flag_or("temperature", s.temperature if s else None)
    if temperature is None:
        temperature = default_temperature(a.get("model") or (s.model if s else None) or None)
    return AnswerOptions(temperature=temperature,
                         top_p=a.get("top_p", 1.0), top_k=a.get("top_k", 0), seed=a.get("seed"),
                         k=flag_or("k", s.k_pinned if s else None), tree_nodes=a.get("tree_nodes"),
                         trees=not a.get("no_trees"), in_flight=a.get("in_flight"),
                         draft=flag_or("draft", s.draft_spec if s else None),
                         max_new_tokens=a.get("max_new_tokens", 256))


def local_ring(a: dict) -> tuple[str, ...]:
    """A ring of --local-peers is one the user asked for: its processes hold layers, unless --placement says how."""
    return () if a.get("placement") else tuple(local_name(i) for i in range(a.get("local_peers") or 0))


def ring_options(args, s: Settings | None = None) -> RingOptions:
    """ask, host and serve share most flags; each lacks some, whose defaults are these."""
    a = vars(args)
    token = a.get("token")
    if not token and "new_token" in a:  # host and serve: the token kept from the last start (sfchat/identity.py)
        from .identity import host_token
        token = host_token(new=bool(a["new_token"]))
    host = HostOptions(model=a.get("model") or (s.model if s else None) or None, token=token,
                       listen=a.get("listen") or "127.0.0.1:0", device=a.get("device"),
                       dtype=a.get("dtype", "auto"), quant=a.get("quant", "auto"), tls=bool(a.get("tls")),
                       relay=a.get("relay"), max_context=a.get("max_context"), graphs=not a.get("no_graphs"),
                       conversations=a.get("max_conversations"), offer_gb=a.get("offer_gb"),
                       placement=a.get("placement"), serving=bool(a.get("serve")),
                       must_hold=local_ring(a))
    serve = None
    if a.get("serve"):
        serve = ServeOptions(a["serve"], api_key=a.get("api_key"), insecure_no_key=bool(a.get("insecure_no_key")),
                             max_conversations=a.get("max_conversations"), keep_alive_s=a.get("keep_alive_s", 10.0),
                             strict_model=bool(a.get("strict_model")))
    return RingOptions(host, answer_options(args, s), serve, local_peers=a.get("local_peers") or 0,
                       wait_peers=a.get("wait_peers") or 0, advertise=a.get("advertise"),
                       prefix_cache=not a.get("no_prefix_cache"))


def join_options(args) -> JoinOptions:
    peer = PeerOptions(args.address, args.token, model=args.model, listen=args.listen, advertise=args.advertise,
                       device=args.device, dtype=args.dtype, quant=args.quant, offer_gb=args.offer_gb,
                       name=args.name, relay=args.relay, tls_pin=args.tls and check_pin(args.tls),
                       graphs=not args.no_graphs, key=os.environ.get(KEY_ENV) or secrets.token_hex(8),
                       threads=args.threads)
    return JoinOptions(peer, stay=args.stay, retry_s=args.retry_s, give_up_after=args.give_up_after)
