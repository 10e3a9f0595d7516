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
    assert {"peers.speculation.drafting", "peers.speculation.drafting.base", "sfchat.tui.app", "sfchat.cli"} <= set(edges)
    assert "peers.host.host" in edges["peers.speculation.generate"]  # from peers.host.host import …
    assert "peers.models.families" in edges["peers.compute.shard"]  # from peers.models import families as …
    assert "peers.models.hub" in edges["peers.models.source"]  # inside a function
    assert "peers.speculation.sampling" in edges["peers.speculation.drafting.base"]  # from … import …
    assert "peers" in edges["sfchat.runtime"]  # from peers import Host


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


def never_table() -> dict[str, set[str]]:
    """The README's layout table of peers/: each sub-package -> the sub-packages it must never import."""
    rows = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("| `peers/") and line.count("|") == 4:
            folder, _owns, never = (cell.strip() for cell in line.strip("|").split("|"))
            rows[folder.strip("`").strip("/").split("/")[1]] = {n.strip() for n in never.split(",") if n.strip()}
    return rows


def broken_nevers(edges: dict[str, set[str]], table: dict[str, set[str]]) -> list[str]:
    out = []
    for name, targets in sorted(edges.items()):
        parts = name.split(".")
        if parts[0] != "peers" or len(parts) < 2:
            continue
        for target in sorted(targets):
            inner = target.split(".")
            if inner[0] == "peers" and len(inner) > 1 and inner[1] in table.get(parts[1], set()):
                out.append(f"{name} imports {target}")
    return out


def test_the_readme_table_is_the_folders():
    folders = {p.name for p in (ROOT / "peers").iterdir() if (p / "__init__.py").exists()}
    assert set(never_table()) == folders
    assert [p.name for p in (ROOT / "peers").glob("*.py")] == ["__init__.py"]  # nothing at the root but the face


def test_every_never_holds():
    table = never_table()
    order = list(table)  # the table runs from the ground up: each row never imports the rows above it
    for i, folder in enumerate(order):
        above = set(order[i + 1:]) - {"member" if folder == "host" else "host" if folder == "member" else ""}
        assert above <= table[folder], f"peers/{folder}/ may import {sorted(above - table[folder])} above it"
    assert broken_nevers(graph(), table) == []


def test_a_broken_never_is_found():
    table = never_table()
    assert broken_nevers({"peers.compute.kv": {"peers.speculation.tree"}}, table) == [
        "peers.compute.kv imports peers.speculation.tree"]
    assert broken_nevers({"peers.host.host": {"peers.member.peer"}}, table) != []
    assert broken_nevers({"peers.speculation.tree": {"peers.compute.kv"}}, table) == []


def test_the_app_uses_the_face():
    """sfchat/ imports the engine through `peers` and its public sub-packages only; bench's baseline also reaches
    the pass engine's device module (its one documented second door)."""
    public = ("peers", "peers.models", "peers.distill")
    found = []
    for name, targets in graph().items():
        if name.split(".")[0] != "sfchat":
            continue
        doors = public + (("peers.compute",) if name == "sfchat.bench" else ())
        found += [f"{name} imports {t}" for t in sorted(targets)
                  if t.split(".")[0] == "peers" and not any(t == d or t.startswith(d + ".") for d in doors)]
    assert found == []


def test_the_face_names_what_exists():
    import importlib

    import peers
    for name, module in peers.FACE.items():
        assert hasattr(importlib.import_module(module), name), f"peers.{name}: not in {module}"
    for name in peers.MODULES:
        assert getattr(peers, name).__name__ == peers.MODULES[name]


def test_import_peers_is_free_of_torch():
    """The face, the models' names and the plan: placement, the layer arithmetic and the roster (which checks
    control messages only; frames' tensors are read where they land)."""
    import subprocess
    import sys
    code = ("import sys, peers, peers.models, peers.base.limits, peers.plan.layers, peers.plan.placement, "
            "peers.plan.roster, peers.plan.holds, peers.plan.drift, peers.plan.gate; "
            "assert 'torch' not in sys.modules, 'torch loaded'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
