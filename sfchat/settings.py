"""The user's settings (default temperature, K, draft, model) in a TOML file in the config dir."""
from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

import tomli_w

from peers import config_dir

from .store import write_atomic


@dataclass
class Settings:
    temperature: float | None = None  # None: the model's (sfchat/options.py)
    k: str = "auto"  # "auto" (adaptive) or a pinned draft length
    draft: str = "auto"  # auto (the best known), none, ngram, or a draft model
    model: str = ""  # "" = the default model

    @property
    def k_pinned(self) -> int | None:
        return None if self.k == "auto" else int(self.k)

    @property
    def draft_spec(self) -> str | None:
        return None if self.draft == "auto" else self.draft


def path() -> Path:
    return config_dir() / "settings.toml"


def parse_k(value) -> str:
    if str(value) == "auto":
        return "auto"
    try:
        k = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"K must be auto or a whole number 0..32, got {value!r}") from None
    if not 0 <= k <= 32:
        raise ValueError("K must be auto or 0..32")
    return str(k)


def parse_temperature(value) -> float:
    try:
        t = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"temperature must be a number in 0..5, got {value!r}") from None
    if not 0 <= t <= 5:
        raise ValueError("temperature must be in 0..5")
    return t


def load() -> Settings:
    """The settings file, each bad or missing value replaced by its default (a typo must not stop the app)."""
    s = Settings()
    try:
        raw = tomllib.loads(path().read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return s
    for key, check in (("temperature", parse_temperature), ("k", parse_k), ("draft", str), ("model", str)):
        if key in raw:
            try:
                setattr(s, key, check(raw[key]))
            except (TypeError, ValueError):
                pass
    return s


def save(s: Settings) -> Path:
    p = path()
    write_atomic(p, "# sfchat settings; `sfchat config` prints this file's path\n" +
                 tomli_w.dumps({k: v for k, v in asdict(s).items() if v is not None}))
    return p

