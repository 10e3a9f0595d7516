"""Model identity: members must run the same model as the host, or the ring would emit garbage."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

IGNORED = {"_name_or_path", "transformers_version", "dtype", "torch_dtype", "architectures"}


def config_fingerprint(model_dir: Path) -> str:
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    core = {k: v for k, v in cfg.items() if k not in IGNORED}
    return hashlib.sha256(json.dumps(core, sort_keys=True).encode()).hexdigest()
