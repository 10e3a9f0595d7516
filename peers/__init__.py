"""The sfchat engine, behind one narrow face: what the app (sfchat/) may use. Each name loads its module on first
use, so `import peers` stays free of torch.

The sub-packages, from the ground up (each imports only those below it; tests/test_layout.py holds them to it):
base, wire, links, models, compute, plan, then host and member side by side, speculation, conversation, distill.
"""
import importlib
import os

# Ring stages take turns on the same cores: OpenMP threads that spin-wait after their work would steal the
# next stage's CPU (docs/benchmarks.md). Must be set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# transformers' from_pretrained swaps in kernels fetched from the hub on CUDA by default; the ring runs
# transformers' own layers, so drafts and bench's baseline must too (same numerics, nothing fetched at load).
os.environ.setdefault("USE_HUB_KERNELS", "0")

# the face: a name -> the module that holds it
FACE = {
    # the host and the member, and their options
    "Host": "peers.host.host", "Peer": "peers.member.peer", "PeerState": "peers.member.peer",
    "HostOptions": "peers.base.options", "PeerOptions": "peers.base.options",
    # a chat and how it is answered
    "Chat": "peers.conversation.chat", "TextStream": "peers.conversation.chat", "render": "peers.conversation.chat",
    "load_tokenizer": "peers.conversation.chat", "eos_ids": "peers.conversation.chat",
    "context_limit": "peers.conversation.context", "WarmRows": "peers.conversation.warm_rows",
    "generate": "peers.speculation.generate", "SamplingParams": "peers.speculation.sampling",
    "KPolicy": "peers.speculation.adaptive", "MAX_NODES": "peers.base.limits",
    **{name: "peers.speculation.grammar" for name in ("Grammar", "GrammarError", "json_grammar", "lark_grammar",
                                                              "JSON_STYLE")},
    # drafters
    "Drafter": "peers.speculation.drafting", "make_drafter": "peers.speculation.drafting",
    "shipped_draft": "peers.speculation.drafting", "is_distilled": "peers.speculation.drafting",
    "sibling_draft": "peers.speculation.drafting.siblings", "SIMULATED": "peers.speculation.drafting.choose",
    "SimulatedDrafter": "peers.speculation.drafting.simulated",
    "parse_simulated": "peers.speculation.drafting.simulated", "simulated_name": "peers.speculation.drafting.simulated",
    # links: addresses, pins, the relay and its shaping, what a failed link raises
    "parse_addr": "peers.links.channel", "ChannelClosed": "peers.links.channel", "dial": "peers.links.dial",
    "check_pin": "peers.links.tls", "AuthError": "peers.links.auth", "new_token": "peers.links.auth",
    "Relay": "peers.links.relay", "Shaping": "peers.links.shaping",
    # what goes wrong, in one line each; where sfchat keeps its files
    **{name: "peers.base.errors" for name in ("ModelError", "RingError", "MemberLeft", "FitError", "CannotServe")},
    **{name: "peers.base.locations" for name in ("cache_dir", "data_dir", "config_dir", "models_dir")},
    # devices and dtypes, as the command line names them
    "DTYPES": "peers.base.dtypes", "pick_dtype": "peers.compute.memory", "default_device": "peers.compute.memory",
}
# public sub-packages and modules, as peers.<name>
MODULES = {"models": "peers.models", "errors": "peers.base.errors", "locations": "peers.base.locations",
           "distill": "peers.distill"}
__all__ = sorted(FACE) + sorted(MODULES)


def __getattr__(name: str):
    if name in MODULES:
        value = importlib.import_module(MODULES[name])
    elif name in FACE:
        value = getattr(importlib.import_module(FACE[name]), name)
    else:
        raise AttributeError(f"module 'peers' has no attribute {name!r}")
    globals()[name] = value
    return value
