"""Models named ORG/NAME[@REVISION] on the Hugging Face hub, fetched with huggingface_hub into the ordinary
Hugging Face cache (so every other tool reuses them), each machine fetching only what it runs.

The host fetches the config, tokenizer and generation config, and the safetensors files holding the
embedding, the final norm, the LM head and its own layers; a member fetches the config and only the files
that hold its own layers (`model.layers.{i}.` in model.safetensors.index.json's weight_map). A revision is
pinned to the commit it resolves to, so every member fetches the same files. huggingface_hub itself resumes
an interrupted file, honours HF_TOKEN and HF_ENDPOINT, and with HF_HUB_OFFLINE=1 reads the cache only.
"""
from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub import constants
from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                    OfflineModeIsEnabled, RepositoryNotFoundError, RevisionNotFoundError)
from huggingface_hub.utils import tqdm as hub_tqdm

from peers.base.errors import ModelError

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
SMALL = (".json", ".txt", ".model", ".jinja", ".tiktoken")  # config, tokenizer, chat template, generation config
LAYER = re.compile(r"model\.layers\.(\d+)\.")
REACH_TIMEOUT_S = 3.0
REACH_KEPT_S = 30.0  # one check serves the requests of one model; a later one looks again
_reach: dict[str, tuple[float, str | None]] = {}  # endpoint -> (when it was checked, why it is out of reach)


def parse(spec: str) -> tuple[str, str | None] | None:
    """ORG/NAME[@REVISION] -> (repo id, revision or None); None for anything else."""
    name, _, rev = spec.partition("@")
    if name.count("/") != 1 or not re.fullmatch(r"[\w.-]+/[\w.-]+", name):
        return None
    return name, rev or None


@dataclass
class Progress:
    """What a fetch has done so far, read by another thread for the ring panel and the peer screen."""

    total: int = 0  # bytes of every file this fetch needs
    done: int = 0  # bytes of the files finished
    current: int = 0  # bytes of the file in flight
    file: str = ""
    active: bool = False

    def text(self) -> str:
        pct = 100 * (self.done + self.current) / self.total if self.total else 0
        return f"fetching {self.file} ({pct:.0f}% of {self.total / 2**20:.1f} MB)"

    def short(self) -> str:
        return f"↓ {100 * (self.done + self.current) / self.total:.0f}%" if self.total else "↓"


def _bar_class(progress: Progress | None, bars: bool):
    """huggingface_hub's tqdm, also counting into `progress`; drawn on the terminal only when `bars`."""

    class Bar(hub_tqdm):
        def __init__(self, *a, **kw):
            super().__init__(*a, **{**kw, "disable": not bars or kw.get("disable", False)})
            self.counted = kw.get("initial", 0) or 0  # a resumed file starts at what is already on disk
            if progress is not None:
                progress.current = self.counted

        def update(self, n=1):
            self.counted += n or 0
            if progress is not None:
                progress.current = self.counted
            return super().update(n)

    return Bar


@dataclass
class HubModel:
    repo_id: str
    commit: str
    files: dict[str, int | None]  # every file at that commit -> its size (None where unknown: offline)
    weight_map: dict[str, str] = field(default_factory=dict)  # tensor name -> file

    @property
    def spec(self) -> str:
        return f"{self.repo_id}@{self.commit}"

    @property
    def dir(self) -> Path:
        return Path(constants.HF_HUB_CACHE) / f"models--{self.repo_id.replace('/', '--')}" / "snapshots" / self.commit

    def weight_files(self, start: int, end: int, *, embed: bool, head: bool) -> list[str]:
        """The safetensors files holding layers [start, end) and, with embed or head, everything outside the
        layers (the embedding, final norm and head)."""
        if self.weight_map == {"*": SINGLE}:
            return [SINGLE]
        out = set()
        for name, f in self.weight_map.items():
            m = LAYER.match(name)
            if (m and start <= int(m.group(1)) < end) or (not m and (embed or head)):
                out.add(f)
        return sorted(out)

    def tensor_shapes(self) -> dict[str, list[int]]:
        """Every tensor's shape, from the safetensors headers: of the files in the cache, and of the others read
        from the hub without their tensors (so the host plans in bytes before fetching anything)."""
        from peers.models.checkpoint import read_header

        shapes = {}
        for f in sorted(set(self.weight_map.values())):
            if (self.dir / f).is_file():
                shapes.update({k: v["shape"] for k, v in read_header(self.dir / f).items()})
                continue
            if constants.HF_HUB_OFFLINE:
                raise ModelError(f"{self.spec[:len(self.repo_id) + 13]}: {f} is not in the Hugging Face cache and "
                                 f"HF_HUB_OFFLINE=1 forbids fetching it")
            if why := out_of_reach():
                raise ModelError(f"could not read the header of {f} of {self.repo_id} (not cached): the hub is out "
                                 f"of reach ({why})")
            try:
                meta = HfApi().parse_safetensors_file_metadata(self.repo_id, f, revision=self.commit)
            except Exception as e:
                raise ModelError(f"could not read the header of {f} of {self.repo_id}: {_why(e)}") from None
            shapes.update({k: list(t.shape) for k, t in meta.tensors.items()})
        return shapes

    def small_files(self) -> list[str]:
        return sorted(f for f in self.files if "/" not in f and f.endswith(SMALL))


def out_of_reach() -> str | None:
    """Why the hub (HF_ENDPOINT) cannot be reached, from one quick connection to it; None when it can, or when a
    proxy stands between (only a request through it can tell). huggingface_hub retries a hub out of reach for
    half a minute before it falls back to the cache: this check lets a machine offline use its cache at once."""
    checked, why = _reach.get(constants.ENDPOINT, (-REACH_KEPT_S, None))
    if time.monotonic() - checked < REACH_KEPT_S:
        return why
    url = urllib.parse.urlsplit(constants.ENDPOINT)
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    why = None
    if not (urllib.request.getproxies().get(url.scheme) and not urllib.request.proxy_bypass(host)):
        got = []  # on a thread: a name lookup takes no timeout, and without a network it can hang for long

        def connect() -> None:
            try:
                socket.create_connection((host, port), timeout=REACH_TIMEOUT_S).close()
                got.append(None)
            except OSError as e:
                got.append(f"{host}: {e.strerror or type(e).__name__}")

        t = threading.Thread(target=connect, name="hub-reach", daemon=True)
        t.start()
        t.join(REACH_TIMEOUT_S)
        why = got[0] if got else f"{host}: no answer in {REACH_TIMEOUT_S:g} s"
    _reach[constants.ENDPOINT] = (time.monotonic(), why)
    return why


def locate(repo_id: str, revision: str | None, say=print) -> HubModel:
    """The commit `revision` names (main by default), the files there, and the weight map; fetches config.json
    and the index (refused here, before any weights, if sfchat cannot split the architecture)."""
    from peers.models.families import family

    cfg = Path(download(repo_id, CONFIG, revision))
    commit = cfg.parent.name  # .../snapshots/<commit>/config.json
    family(json.loads(cfg.read_text()).get("model_type"))
    try:
        if constants.HF_HUB_OFFLINE:
            raise OfflineModeIsEnabled("offline")
        if why := out_of_reach():
            raise ConnectionError(why)
        info = HfApi().model_info(repo_id, revision=commit, files_metadata=True)
        files, cached = {s.rfilename: s.size for s in info.siblings or []}, False
    except (RepositoryNotFoundError, RevisionNotFoundError, GatedRepoError) as e:
        raise ModelError(f"cannot list the files of {repo_id}@{commit[:12]}: {_why(e)}") from None
    except Exception as e:  # offline or unreachable: what the cache holds (config.json came from there too)
        if not constants.HF_HUB_OFFLINE:
            say(f"the hub is out of reach ({_why(e)}): using the cached files of {repo_id}@{commit[:12]}")
        files = {str(p.relative_to(cfg.parent)): None for p in cfg.parent.rglob("*") if p.is_file()}
        cached = True
    model = HubModel(repo_id, commit, files)
    if INDEX in files or (cached and SINGLE not in files):
        index = json.loads(Path(download(repo_id, INDEX, commit)).read_text())
        model.weight_map = dict(index["weight_map"])
    elif SINGLE in files:  # one file holds every tensor: each member needs all of it
        model.weight_map = {"*": SINGLE}
    else:
        raise ModelError(f"{repo_id}@{commit[:12]} has no safetensors weights (sfchat reads safetensors only)")
    return model


def fetch(model: HubModel, names: list[str], progress: Progress | None = None, bars: bool = True) -> Path:
    """Each of `names` into the cache (a file already there costs nothing); the snapshot directory."""
    if progress is not None:
        progress.total = sum(model.files.get(n) or 0 for n in names)
        progress.done, progress.current, progress.active = 0, 0, True
    try:
        for name in names:
            if progress is not None:
                progress.file, progress.current = name, 0
            download(model.repo_id, name, model.commit, _bar_class(progress, bars))
            if progress is not None:
                progress.done += model.files.get(name) or 0
                progress.current = 0
    finally:
        if progress is not None:
            progress.active = False
    return model.dir


def download(repo_id: str, name: str, revision: str | None, bar=None) -> str:
    """One file through huggingface_hub; any failure is a ModelError naming the model and the file."""
    where = f"{repo_id}@{revision[:12]}" if revision and len(revision) == 40 else repo_id
    unreachable = None if constants.HF_HUB_OFFLINE else out_of_reach()
    try:
        return hf_hub_download(repo_id, name, revision=revision, tqdm_class=bar or _bar_class(None, True),
                               local_files_only=unreachable is not None)
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as e:
        if constants.HF_HUB_OFFLINE:
            raise ModelError(f"{where}: {name} is not in the Hugging Face cache and HF_HUB_OFFLINE=1 forbids "
                             f"fetching it") from None
        if unreachable:
            raise ModelError(f"could not fetch {name} of {where} (not cached): the hub is out of reach "
                             f"({unreachable})") from None
        cause = e.__cause__ or e.__context__ or e  # the hub was out of reach and the cache lacks the file
        raise ModelError(f"could not fetch {name} of {where} (not cached): {_why(cause)}") from None
    except GatedRepoError:
        raise ModelError(f"{where} is gated: accept its terms on the hub and set HF_TOKEN ({name})") from None
    except RepositoryNotFoundError:
        raise ModelError(f"no model {repo_id} on the hub (or it is private: set HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise ModelError(f"{repo_id} has no revision {revision}") from None
    except EntryNotFoundError:
        raise ModelError(f"{where} has no file {name}") from None
    except (OSError, HfHubHTTPError, ValueError) as e:
        raise ModelError(f"could not fetch {name} of {where}: {_why(e)}") from None


def _why(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return (lines[0] if lines else type(e).__name__)[:200]
