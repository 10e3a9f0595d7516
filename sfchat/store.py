"""Saved conversations: one JSON file per chat under the user data dir, rewritten atomically as it grows."""
from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from peers import data_dir


def write_atomic(path: Path, text: str) -> None:
    """Write a temporary file beside `path` and rename it over: a reader or a crash never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def why_not_written(path: Path, e: OSError) -> str:
    """Why write_atomic(path) failed, said of the user's path (the error itself names the temporary file)."""
    return f"there is no folder {path.parent}" if not path.parent.is_dir() else e.strerror or type(e).__name__


def new_id() -> str:
    # sortable by time, readable in a file listing, unique enough for one user
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


@dataclass
class Conversation:
    id: str = field(default_factory=new_id)
    messages: list[dict] = field(default_factory=list)
    model: str = ""
    temperature: float | None = None
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)

    @property
    def title(self) -> str:
        first = next((m["content"] for m in self.messages if m["role"] == "user"), "")
        line = " ".join(first.split())
        return (line[:57] + "…" if len(line) > 58 else line) or "(empty)"

    @classmethod
    def from_dict(cls, d: dict) -> Conversation:
        msgs = [{"role": str(m["role"]), "content": str(m["content"])} for m in d.get("messages", [])]
        temp = d.get("temperature")
        return cls(id=str(d["id"]), messages=msgs, model=str(d.get("model", "")),
                   temperature=float(temp) if isinstance(temp, (int, float)) else None,
                   created=float(d.get("created", 0)), updated=float(d.get("updated", 0)))


def chats_dir() -> Path:
    d = data_dir() / "chats"
    d.mkdir(parents=True, exist_ok=True)
    return d


def path_of(chat_id: str) -> Path:
    if not chat_id or "/" in chat_id or chat_id.startswith("."):
        raise ValueError(f"bad chat id {chat_id!r}")
    return chats_dir() / f"{chat_id}.json"


def save(conv: Conversation) -> Path:
    conv.updated = time.time()
    path = path_of(conv.id)
    write_atomic(path, json.dumps(asdict(conv), ensure_ascii=False, indent=1))
    return path


def load(chat_id: str) -> Conversation:
    path = path_of(chat_id)
    if not path.is_file():
        raise ValueError(f"no saved chat {chat_id!r} (in {chats_dir()})")
    return Conversation.from_dict(json.loads(path.read_text(encoding="utf-8")))


def list_chats() -> list[Conversation]:
    """Every readable saved chat, the most recently updated first; a damaged file is skipped, not fatal."""
    out = []
    for p in chats_dir().glob("*.json"):
        try:
            out.append(Conversation.from_dict(json.loads(p.read_text(encoding="utf-8"))))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(out, key=lambda c: c.updated, reverse=True)


def resume(which: str) -> Conversation:
    """`--resume` (the latest chat) or `--resume ID`."""
    if which == "last":
        chats = list_chats()
        if not chats:
            raise ValueError(f"no saved chats yet (in {chats_dir()})")
        return chats[0]
    return load(which)


def to_markdown(conv: Conversation) -> str:
    parts = [f"# {conv.title}\n"]
    for m in conv.messages:
        parts.append(f"**{m['role']}:**\n\n{m['content']}\n")
    return "\n".join(parts)
