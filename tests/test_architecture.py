"""The layer rule of docs/architecture.md, read from the source's imports: a lower layer never imports a
higher one, no two modules import each other in a circle, and nothing imports the package façade.
Imports inside functions count. Imports under ``if TYPE_CHECKING:`` (type hints only) do not count for the
layers, and do for the circles: a circle hidden under it is still two modules that need each other."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# docs/architecture.md, "Layers": lowest first; a name is a package or module under reform
LAYERS = [
    {"version", "notes", "stats", "outputs", "machine", "model", "data", "documents"},
    {"engine", "store"},
    {"heads", "conformance"},
    {"methods"},
    {"pipeline"},
    {"library"},
    {"server"},
    {"cluster"},
    {"eval"},
    {"bench"},
    {"cli", "__main__"},
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def modules() -> dict[str, Path]:
    found = {}
    for path in (SRC / "reform").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path], type_only: bool = False) -> set[str]:
    """Modules of ours that ``name`` imports at run time (and for type hints only, with ``type_only``)."""
    tree = ast.parse(path.read_text())
    hints = set() if type_only else {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                                     and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if id(node) in hints:
            continue
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            candidates = [target] + [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        found |= {c for c in candidates if c in known and c != name}
    return found


def graph(type_only: bool = False) -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known, type_only) for name, path in known.items()}


def top(name: str) -> str:
    return name.split(".")[1] if "." in name else name


def test_every_package_has_a_layer():
    assert {top(m) for m in modules() if m != "reform"} <= set(LAYER), "add the new package to LAYERS and docs"


def test_lower_layers_never_import_higher_ones():
    wrong = sorted(f"{a} imports {b}" for a, targets in graph().items() if a != "reform" for b in targets
                   if b == "reform" or LAYER[top(b)] > LAYER[top(a)])
    assert not wrong, wrong


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def test_no_module_cycles():
    assert cycles(graph(type_only=True)) == []


def test_no_package_cycles():
    packages = defaultdict(set)
    for a, targets in graph(type_only=True).items():
        packages[top(a)] |= {top(b) for b in targets if top(b) != top(a)}
    assert cycles(packages) == []


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_package_docstrings_name_their_place_on_the_map():
    for name, path in modules().items():
        if path.name == "__init__.py" and name.count(".") == 1:
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            assert "docs/architecture.md" in doc, f"{name}'s docstring does not point to docs/architecture.md"
