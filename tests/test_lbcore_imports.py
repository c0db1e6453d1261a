"""lbcore's modules import one another in one direction: the import graph has no cycle.

Every import counts: at module level, inside functions and under ``TYPE_CHECKING``.
"""

import ast
import pathlib

LBCORE = pathlib.Path(__file__).resolve().parents[1] / "lbcore"


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(LBCORE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in sorted(LBCORE.rglob("*.py"))}


def _imports(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """The lbcore modules ``name`` imports, anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            # "from lbcore import fade" imports the module lbcore.fade
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    # The package itself re-exports everything; edges into it would only say "lbcore".
    return {
        name: _imports(name, path, known) - {"lbcore"}
        for name, path in mods.items()
        if name != "lbcore"
    }


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return [*stack[stack.index(m) :], m]
            if m not in state and (found := visit(m)) is not None:
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)) is not None:
            return found
    return None


def test_the_graph_sees_every_kind_of_import():
    g = _graph()
    assert "lbcore.plan" in g["lbcore.route"]  # module level
    assert "lbcore.fade" in g["lbcore.plan"]


def test_a_cycle_would_be_found():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_a_function_level_import_is_an_edge(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from lbcore.ring import Ring\n"
        "def f():\n    from lbcore import plan\n"
    )
    assert _imports("lbcore.m", src, {"lbcore.ring", "lbcore.plan", "lbcore.m"}) == {
        "lbcore.ring",
        "lbcore.plan",
    }


def test_lbcore_imports_are_acyclic():
    assert _cycle(_graph()) is None
