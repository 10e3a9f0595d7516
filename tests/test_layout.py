"""The layout's joints run one way: no import cycle among peers and sfchat modules (imports inside functions
count), and the engine (peers/) never imports the app (sfchat/)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("peers", "sfchat")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports, at any depth of its code, relative imports resolved. `from a import b`
    counts as importing `a.b` when that is a module, else `a`. (A package's `__init__` that runs first is not
    counted: it is only a cycle when the package itself is imported by name.)"""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # one dot: this package; each more, one package up
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.add(sub if sub in known else base)
    found = set()
    for target in targets:
        parts = target.split(".")
        longest = [m for m in (".".join(parts[:i]) for i in range(len(parts), 0, -1)) if m in known]
        found.update(longest[:1])
    found.discard(name)
    return found


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read():
    edges = graph()
    assert {"peers.drafting", "peers.drafting.base", "sfchat.tui.app", "sfchat.cli"} <= set(edges)
    assert "peers.host" in edges["peers.generate"]  # from .host import …
    assert "peers.architectures" in edges["peers.shard"]  # from . import architectures
    assert "peers.hub" in edges["peers.models"]  # inside a function
    assert "peers.sampling" in edges["peers.drafting.base"]  # from ..sampling import …
    assert "peers.host" in edges["sfchat.runtime"]  # from peers.host import …


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_engine_does_not_import_the_app():
    edges = graph()
    into_app = {name: sorted(m for m in targets if m.split(".")[0] == "sfchat")
                for name, targets in edges.items() if name.split(".")[0] == "peers"}
    assert {name: targets for name, targets in into_app.items() if targets} == {}


def test_the_gpu_check_names_no_package_index():
    """It installs CUDA torch with `pip install --isolated`: pip's own default index, whatever a local
    configuration says, and no index's address written into the project."""
    script = (ROOT / "scripts" / "gpu_check").read_text()
    install = next(line for line in script.splitlines() if "pip install" in line)
    assert "--isolated" in install and "--index-url" not in script and "://" not in script
