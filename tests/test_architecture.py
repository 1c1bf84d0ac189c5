"""The import rules of the layout: the registry imports neither the
gateway nor discovery, the shared outbound layer (``outbound/``) imports none of the apps, and
the gateway's modules import one another one way (no cycle, counting imports inside functions
too, which hide cycles rather than remove them)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth, except under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for child in ast.walk(node))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _modules(package: str) -> dict[str, Path]:
    return {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
        for path in (ROOT / package).rglob("*.py")
    }


def test_the_registry_imports_neither_the_gateway_nor_discovery():
    offenders = {
        module: sorted(
            name for name in _imports(path) if name.split(".")[0] in ("gateway", "discovery")
        )
        for module, path in _modules("registry").items()
    }
    assert {m: names for m, names in offenders.items() if names} == {}


def test_the_outbound_layer_imports_none_of_the_apps():
    """``outbound/`` is shared by the registry, the gateway and discovery: it imports none."""
    apps = ("registry", "gateway", "discovery", "config")
    offenders = {
        module: sorted(name for name in _imports(path) if name.split(".")[0] in apps)
        for module, path in _modules("outbound").items()
    }
    assert {m: names for m, names in offenders.items() if names} == {}


def test_gateway_modules_import_one_another_one_way():
    modules = _modules("gateway")
    graph = {
        module: {name for name in _imports(path) if name in modules and name != module}
        for module, path in modules.items()
    }
    # Depth-first search for a back edge: any cycle is reported with its path.
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append(
                    trail[trail.index(target) :] + [module, target]
                    if target in trail
                    else [module, target]
                )
            elif target not in state:
                visit(target, trail + [module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert cycles == []


def test_the_import_check_sees_a_cycle(tmp_path):
    """The check above can fail: two modules importing each other inside functions."""
    (tmp_path / "a.py").write_text("def f():\n    from gateway import b\n")
    (tmp_path / "b.py").write_text("from gateway import a\n")
    assert "gateway.b" in _imports(tmp_path / "a.py")
    assert "gateway.a" in _imports(tmp_path / "b.py")


def test_only_the_composition_root_imports_the_mcp_bridge():
    """``mcp_bridge/`` sits above the gateway, discovery and the registry (it composes them);
    none of them, nor the console, imports it: the node's router gets its routes from
    ``config.asgi``."""
    offenders = {
        module: sorted(name for name in _imports(path) if name.split(".")[0] == "mcp_bridge")
        for package in ("registry", "gateway", "discovery", "console", "outbound", "ard")
        for module, path in _modules(package).items()
    }
    assert {m: names for m, names in offenders.items() if names} == {}
