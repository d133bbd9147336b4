"""The package's import graph has no cycles (module-level or inside functions; imports
under `if TYPE_CHECKING:` are annotations only and do not count), and the rules layer
sits below the evaluator and the formulations."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parent.parent / "placer"


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST) -> set[str]:
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("placer"):
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("placer"))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def import_graph() -> nx.DiGraph:
    g = nx.DiGraph()
    modules = {_module(p): p for p in PACKAGE.rglob("*.py")}
    for name, path in modules.items():
        g.add_node(name)
        for target in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            # `from placer.perf import comm` names a module too
            if target in modules and target != name:
                g.add_edge(name, target)
    return g


def test_no_import_cycles() -> None:
    g = import_graph()
    # packages' __init__ re-export lazily; cycles through them are not layering cycles
    h = g.subgraph(n for n in g if n not in {"placer", "placer.study"})
    cycles = list(nx.simple_cycles(h))
    assert not cycles, cycles


def test_rules_below_evaluator_and_formulations() -> None:
    g = import_graph()
    below = nx.descendants(g, "placer.rules")
    assert not below & {
        "placer.evaluate",
        "placer.resilience",
        "placer.optimize.milp",
        "placer.optimize.cpsat",
        "placer.cli",
    }
    for user in (
        "placer.optimize.space",
        "placer.optimize.data",
        "placer.optimize.explain",
        "placer.optimize.driver",
        "placer.outputs.launch",
    ):
        assert "placer.rules" in g.successors(user), user
