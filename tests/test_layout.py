"""The package layout tells the architecture: rooms import each other without cycles, the
data-consuming leaves (`bench`, `refmodels`) stay leaves, and no module reaches into another
module's private names. Imports anywhere in a file count, including those inside functions."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specc"


def _room(module: str) -> str:
    """`specc.X...` -> X (a subpackage or a module at the package root); `specc` -> `specc`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "specc"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(tree: ast.AST) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) for every import of a specc module in `tree`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "specc":
            found.append((node.lineno, node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names if alias.name.split(".")[0] == "specc"]
    return found


def _room_graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        source = _room(_module_name(path))
        for _, module, names in _imported(ast.parse(path.read_text(encoding="utf-8"))):
            # `from specc import x` imports the room x
            rooms = [_room(f"specc.{n}") for n in names] if module == "specc" else [_room(module)]
            edges[source] |= {room for room in rooms if room != source}
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle between rooms, or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(room: str) -> list[str] | None:
        state[room] = "open"
        stack.append(room)
        for other in sorted(edges.get(room, ())):
            if state.get(other) == "open":
                return stack[stack.index(other):] + [other]
            if other not in state and (found := visit(other)):
                return found
        stack.pop()
        state[room] = "done"
        return None

    for room in sorted(edges):
        if room not in state and (found := visit(room)):
            return found
    return None


def test_rooms_import_each_other_without_cycles():
    assert _cycle(_room_graph()) is None


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_bench_and_refmodels_are_leaves():
    edges = _room_graph()
    assert not edges["bench"] & {"methods", "refmodels"}, edges["bench"]
    assert not edges["refmodels"] & {"methods", "bench"}, edges["refmodels"]
    importers = {room for room, imported in edges.items() if imported & {"bench", "refmodels"}}
    assert importers <= {"cli"}, importers   # the command line reaches them; nothing else does


def test_no_module_imports_a_private_name_of_another():
    private = []
    for folder in ("specc", "tests", "benchmarks", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            for line, module, names in _imported(ast.parse(path.read_text(encoding="utf-8"))):
                private += [f"{path.relative_to(ROOT)}:{line} {module}.{name}" for name in names
                            if name.startswith("_") and not name.startswith("__")]
    assert private == []


def test_shared_passes_serve_more_than_one_method():
    """`specc/passes/` holds what several methods (or every method, through the contract or the
    compiler) use; a pass only one method uses lives in that method's package."""
    users: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        if module.startswith("specc.passes."):
            continue
        parts = module.split(".")
        user = parts[2] if parts[1:2] == ["methods"] and len(parts) > 2 else _room(module)
        for _, imported, _ in _imported(ast.parse(path.read_text(encoding="utf-8"))):
            if imported.startswith("specc.passes."):
                users[imported.split(".")[2]].add(user)
    single = {name: sorted(who) for name, who in users.items()
              if len(who) == 1 and not who & {"contract", "compiler", "train"}}
    assert single == {}
