"""Where sfchat keeps its files: platformdirs' user dirs, overridable for tests and CI."""
from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP = "sfchat"


def _dir(env: str, default: str) -> Path:
    p = Path(os.environ.get(env) or default)
    p.mkdir(parents=True, exist_ok=True)
    return p


def cache_dir() -> Path:
    return _dir("SFCHAT_CACHE_DIR", platformdirs.user_cache_dir(APP))


def data_dir() -> Path:
    return _dir("SFCHAT_DATA_DIR", platformdirs.user_data_dir(APP))


def config_dir() -> Path:
    return _dir("SFCHAT_CONFIG_DIR", platformdirs.user_config_dir(APP))


def models_dir() -> Path:
    return _dir("SFCHAT_MODELS_DIR", str(cache_dir() / "models"))
