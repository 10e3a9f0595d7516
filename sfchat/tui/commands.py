"""The commands typed in the prompt line, parsed apart from the screen so they are easy to test."""
from __future__ import annotations

from dataclasses import dataclass

from sfchat.settings import parse_k, parse_temperature

HELP = [
    ("/k [N|auto]", "pin the draft length K, or let it adapt; alone: the current K"),
    ("/temp [T]", "sampling temperature, 0 = greedy (kept as your default); alone: the current one"),
    ("/draft WHICH", "auto: the best known drafter (on), none (off), ngram: prompt lookup, or a draft model: "
                     "a directory, a .gguf file or a hub id ORG/NAME"),
    ("/new", "start a new chat"),
    ("/chats", "reopen a saved chat"),
    ("/save [FILE.md]", "save now (chats save as they grow), or export as Markdown"),
    ("/copy", "copy the last answer to the clipboard"),
    ("/invite", "copy the `sfchat join …` command"),
    ("/help", "this screen"),
]
DRAFT_WORDS = {"on": "auto", "auto": "auto", "off": "none", "none": "none", "ngram": "ngram"}


def check_draft(arg: str) -> str:
    """The setting for `/draft ARG`: a word, or a draft model that exists here (loading it is the engine's)."""
    if not arg:
        raise ValueError("which drafter? auto (on), none (off), ngram or a model")
    if arg in DRAFT_WORDS:
        return DRAFT_WORDS[arg]
    from peers.models import names_a_model

    if not names_a_model(arg):
        raise ValueError(f"no draft model {arg!r}: auto, none, ngram, a model directory, a .gguf file or a hub id "
                         "ORG/NAME")
    return arg


def current_k(k: int | None) -> str:
    """What `/k` alone says."""
    return f"K is {'auto: it adapts' if k is None else f'{k}, pinned'} (/k N pins it, /k auto lets it adapt)"


def current_temperature(t: float) -> str:
    """What `/temp` alone says."""
    return f"The temperature is {t:g} (/temp T changes it, 0 = greedy)"


class CommandError(ValueError):
    pass


@dataclass
class Command:
    name: str
    value: object = None


def parse(line: str) -> Command:
    name, _, arg = line[1:].strip().partition(" ")
    arg = arg.strip()
    try:
        if name in ("k", "temp", "temperature") and not arg:
            return Command(name[:4])  # no value: show the current one
        if name == "k":
            return Command("k", parse_k(arg))
        if name in ("temp", "temperature"):
            return Command("temp", parse_temperature(arg))
        if name == "draft":
            return Command("draft", check_draft(arg))
        if name in ("new", "chats", "copy", "invite", "help", "quit"):
            return Command(name)
        if name == "save":
            return Command("save", arg or None)
    except ValueError as e:
        raise CommandError(f"/{name}: {e}") from None
    raise CommandError(f"unknown command /{name}; /help lists them")
