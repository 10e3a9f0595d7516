"""Shipped drafts: package data under peers/speculation/drafting/shipped/<target name>, found with importlib.resources, so a
plain (non-editable) install uses them too. SFCHAT_DRAFTS_DIR points at another directory of drafts."""
from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from peers.models.fingerprint import config_fingerprint
from peers.models.source import DEFAULT_MODEL
from peers.speculation.drafting.feature_net import is_distilled, read_meta


def drafts_dir() -> Path | None:
    """Where the shipped drafts are: SFCHAT_DRAFTS_DIR, else this package's `shipped` data (None where the package
    is not plain files, e.g. zipped: the drafter then falls back to ngram)."""
    if env := os.environ.get("SFCHAT_DRAFTS_DIR"):
        return Path(env)
    d = resources.files(__package__) / "shipped"
    return d if isinstance(d, Path) else None


def shipped_draft(target_dir: Path) -> Path | None:
    """The shipped draft for the embedded default target, if there is one and it was distilled from this very
    model (same config); else None."""
    from peers.base.locations import models_dir

    if Path(target_dir).resolve() != (models_dir() / DEFAULT_MODEL).resolve():
        return None
    if (root := drafts_dir()) is None or not is_distilled(d := root / DEFAULT_MODEL):
        return None
    return d if read_meta(d).get("target_config") == config_fingerprint(target_dir) else None
