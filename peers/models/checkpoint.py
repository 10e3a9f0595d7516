"""What a checkpoint holds, read from config.json and the safetensors headers alone: no torch, no tensor bytes.

A safetensors file starts with an 8-byte little-endian header length and a JSON header mapping each tensor's name
to its dtype, shape and byte offsets; reading that is enough to size a model before anything is loaded.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Stored:
    """Where one tensor's bytes lie: its file, the offset of its first byte, its dtype (safetensors' name) and
    shape."""

    path: Path
    offset: int
    dtype: str
    shape: tuple[int, ...]


def read_header(path: Path) -> dict[str, dict]:
    """tensor name -> {"dtype", "shape", "data_offsets"} of one safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def weight_files(model_dir: Path) -> dict[str, Path]:
    """tensor name -> the safetensors file that holds it."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        return {k: model_dir / f for k, f in json.loads(index.read_text())["weight_map"].items()}
    names = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        names.update({k: f for k in read_header(f)})
    return names


def locations(model_dir: Path, names=None) -> dict[str, Stored]:
    """tensor name -> where its bytes lie, from the headers of the files that hold `names` (all: None), each read
    once; a member has only the files of its own layers."""
    files = weight_files(model_dir)
    out = {}
    for f in sorted(set(files.values()) if names is None else {files[n] for n in names if n in files}):
        out.update(file_locations(f))
    return out


def file_locations(path: Path) -> dict[str, Stored]:
    """tensor name -> where its bytes lie, for one safetensors file."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
    return {name: Stored(path, 8 + n + e["data_offsets"][0], e["dtype"], tuple(e["shape"]))
            for name, e in read_header(path).items()}


def tensor_shapes(model_dir: Path) -> dict[str, list[int]]:
    shapes = {}
    for f in sorted(set(weight_files(model_dir).values())):
        shapes.update({k: v["shape"] for k, v in read_header(f).items()})
    return shapes


def read_config(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())
