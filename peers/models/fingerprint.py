"""Model identity: members must run the same model as the host, or the ring would emit garbage.

Two checks before a member serves: the config, and the tensors of the member's own layer span, hashed from
the safetensors bytes on each side (whole tensors up to 4 MB, evenly spaced 64 KB samples beyond).
"""
from __future__ import annotations

import functools
import hashlib
import json
import struct
from pathlib import Path

IGNORED = {"_name_or_path", "transformers_version", "dtype", "torch_dtype", "architectures"}
WHOLE = 4 << 20
SAMPLE, SAMPLES = 64 << 10, 16


def config_fingerprint(model_dir: Path) -> str:
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    core = {k: v for k, v in cfg.items() if k not in IGNORED}
    return hashlib.sha256(json.dumps(core, sort_keys=True).encode()).hexdigest()


@functools.lru_cache(maxsize=16)
def _headers(files: tuple) -> dict[str, tuple[Path, int, dict]]:
    """tensor name -> (file, data start, header entry), read from the files' JSON headers only."""
    out = {}
    for f, _, _ in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        out.update({k: (f, 8 + n, v) for k, v in header.items() if k != "__metadata__"})
    return out


def span_fingerprint(model_dir: Path, start: int, end: int) -> str:
    """The hash of layers [start, end): of each layer's own hash, so a re-plan's new span, made of layers hashed
    before, costs nothing (the files' sizes and times are part of the key: a file rewritten is hashed again)."""
    files = tuple((str(f), st.st_size, st.st_mtime_ns)
                  for f in sorted(Path(model_dir).glob("*.safetensors")) for st in [f.stat()])
    return hashlib.sha256("|".join(_layer(files, i) for i in range(start, end)).encode()).hexdigest()


@functools.lru_cache(maxsize=4096)
def _layer(files: tuple, i: int) -> str:
    h = hashlib.sha256()
    prefix = f"model.layers.{i}."
    for name, (f, base, entry) in sorted(_headers(files).items()):
        if not name.startswith(prefix):
            continue
        b, e = entry["data_offsets"]
        h.update(f"{name}|{entry['dtype']}|{entry['shape']}".encode())
        with open(f, "rb") as fh:
            if e - b <= WHOLE:
                fh.seek(base + b)
                h.update(fh.read(e - b))
            else:
                for k in range(SAMPLES):
                    fh.seek(base + b + (e - b - SAMPLE) * k // (SAMPLES - 1))
                    h.update(fh.read(SAMPLE))
    return h.hexdigest()
