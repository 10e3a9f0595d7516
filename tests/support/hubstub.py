"""A stand-in for the Hugging Face hub on 127.0.0.1, for huggingface_hub pointed at it with HF_ENDPOINT.

It serves model repositories from local directories at one commit, with what huggingface_hub reads:
- GET /api/models/{repo}[/revision/{rev}]: the model info (sha, siblings with sizes);
- HEAD /{repo}/resolve/{rev}/{file}: X-Repo-Commit, ETag, Content-Length (get_hf_file_metadata);
- GET the same: the bytes, or from an offset with `Range: bytes=N-` (206, Content-Range), as http_get resumes,
  or a slice with `Range: bytes=A-B`, as huggingface_hub reads a safetensors header without the tensors.
Every request is recorded, so a test can count which files a process fetched. `cut` makes the first GET of a file
stop after that many bytes (a dropped connection), to test resuming.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class HubStub:
    def __init__(self, repos: dict[str, Path], commit: str = COMMIT):
        self.repos, self.commit = repos, commit
        self.requests: list[tuple[str, str, str]] = []  # (method, repo file or api path, Range header)
        self.cut: dict[str, int] = {}
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_HEAD(self):
                stub._serve(self, body=False)

            def do_GET(self):
                stub._serve(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def gets(self, suffix: str = "") -> list[str]:
        """Files fetched with GET (whole or resumed; not header slices), in order."""
        return [f for m, f, r in self.requests if m == "GET" and f.endswith(suffix) and not f.startswith("api/")
                and not re.fullmatch(r"bytes=\d+-\d+", r)]

    # --- serving --------------------------------------------------------------------------------------------

    def _serve(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = h.path.split("?")[0]
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path):
            self._log(h, f"api/{m.group(1)}")
            return self._info(h, m.group(1), m.group(2))
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if not m:
            return self._error(h, 404, "EntryNotFound", "no such route")
        repo, rev, name = m.groups()
        self._log(h, name)
        root = self.repos.get(repo)
        if root is None:
            return self._error(h, 401, "RepoNotFound", "Repository not found")
        if rev not in ("main", self.commit):
            return self._error(h, 404, "RevisionNotFound", "Invalid rev id")
        f = root / name
        if not f.is_file():
            return self._error(h, 404, "EntryNotFound", "Entry not found")
        data = f.read_bytes()
        start, end = 0, len(data)
        if body and (r := re.fullmatch(r"bytes=(\d+)-(\d*)", h.headers.get("Range", ""))):
            start = int(r.group(1))
            end = min(int(r.group(2)) + 1, len(data)) if r.group(2) else len(data)
        ranged = body and "Range" in h.headers
        h.send_response(206 if ranged else 200)
        h.send_header("X-Repo-Commit", self.commit)
        h.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Length", str(end - start))
        if ranged:
            h.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        h.end_headers()
        if not body:
            return
        with self.lock:
            cut = self.cut.pop(name, None)
        if cut is not None:  # a dropped connection: part of the body, then the socket closes
            h.wfile.write(data[start : start + cut])
            h.wfile.flush()
            h.close_connection = True
            h.connection.shutdown(2)
            return
        h.wfile.write(data[start:end])

    def _log(self, h, what: str) -> None:
        with self.lock:
            self.requests.append((h.command, what, h.headers.get("Range", "")))

    def _info(self, h, repo: str, rev: str | None) -> None:
        root = self.repos.get(repo)
        if root is None:
            return self._error(h, 401, "RepoNotFound", "Repository not found")
        if rev not in (None, "main", self.commit):
            return self._error(h, 404, "RevisionNotFound", "Invalid rev id")
        siblings = [{"rfilename": str(p.relative_to(root)), "size": p.stat().st_size}
                    for p in sorted(root.rglob("*")) if p.is_file()]
        self._json(h, 200, {"id": repo, "modelId": repo, "sha": self.commit, "private": False, "siblings": siblings})

    def _error(self, h, status: int, code: str, message: str) -> None:
        self._json(h, status, {"error": message}, {"X-Error-Code": code, "X-Error-Message": message})

    def _json(self, h, status: int, obj, headers: dict | None = None) -> None:
        raw = json.dumps(obj).encode()
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(raw)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(raw)


def shard_by_layer(model_dir: Path, out: Path) -> Path:
    """Re-save a model with one safetensors file per decoder layer and one for everything else (embedding, final
    norm, head), with model.safetensors.index.json, like a big model on the hub; returns out."""
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for f in model_dir.glob("*.safetensors"):
        tensors.update(load_file(f))
    groups: dict[str, dict] = {}
    for name, t in tensors.items():
        m = re.match(r"model\.layers\.(\d+)\.", name)
        groups.setdefault(f"layer{int(m.group(1)):02d}" if m else "outer", {})[name] = t.contiguous()
    n = len(groups)
    weight_map = {}
    for i, key in enumerate(sorted(groups)):
        fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        save_file(groups[key], out / fname, metadata={"format": "pt"})
        weight_map.update({k: fname for k in groups[key]})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    for f in model_dir.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            (out / f.name).write_bytes(f.read_bytes())
    return out
