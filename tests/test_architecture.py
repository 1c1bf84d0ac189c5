"""The import rules of the layout: the project's packages form layers that import one way
(:data:`LAYERS`), and inside every package the modules import one another one way. Imports
inside functions count (they hide a cycle rather than remove it); imports under
``if TYPE_CHECKING:`` do not (they never run)."""

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


#: Each package and the packages it may import. ``core`` is the ground (env reading, the node's
#: lifecycle hooks, the outage breaker, tracing setup, the lz4 migration helper); ``outbound``
#: holds every outbound HTTP client; ``registry`` is the domain; ``discovery`` and ``ard`` build
#: on it; ``gateway`` is the proxy and its cluster runtime (and the call statistics the console
#: reads); ``console`` is the operator UI; ``mcp_bridge`` composes gateway, discovery and the
#: registry; ``node`` serves it all (server adapters, edge limits, the ``serve`` command, the
#: in-process periodic runner, health and error pages); ``config`` is settings, URLs, the ASGI
#: entry, WSGI and Celery, on top. ``push`` (push notifications relayed by the gateway: its
#: configs, the ingress, delivery, signing) builds on the registry; the gateway relays through
#: it and the console may show it.
LAYERS: dict[str, set[str]] = {
    "core": set(),
    "outbound": {"core"},
    "registry": {"core", "outbound"},
    "push": {"core", "outbound", "registry"},
    "discovery": {"core", "outbound", "registry"},
    "ard": {"core", "outbound", "registry"},
    "gateway": {"core", "outbound", "registry", "push"},
    "console": {"core", "outbound", "registry", "discovery", "ard", "gateway", "push"},
    "mcp_bridge": {"core", "outbound", "registry", "discovery", "ard", "gateway", "push"},
    "node": {"core", "outbound", "registry", "discovery", "ard", "gateway", "console",
             "mcp_bridge", "push"},
    "config": {"core", "outbound", "registry", "discovery", "ard", "gateway", "console",
               "mcp_bridge", "node", "push"},
}


def _package_edges() -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> the importing modules (migrations included:
    they run in every process that migrates)."""
    edges: dict[tuple[str, str], list[str]] = {}
    for package in LAYERS:
        for module, path in _modules(package).items():
            for name in _imports(path):
                target = name.split(".")[0]
                if target in LAYERS and target != package:
                    edges.setdefault((package, target), []).append(module)
    return {edge: sorted(set(modules)) for edge, modules in edges.items()}


def test_every_package_of_the_project_has_a_layer():
    packages = {
        path.parent.name for path in ROOT.glob("*/__init__.py")
        if path.parent.name not in ("tests", "bench", "examples", "scripts")
    }
    assert packages == set(LAYERS)


def test_packages_import_only_the_layers_below_them():
    offenders = {
        f"{package} -> {target}": modules
        for (package, target), modules in _package_edges().items()
        if target not in LAYERS[package]
    }
    assert offenders == {}


def test_the_gateway_imports_no_api_surface_of_the_registry():
    """The registry's HTTP surfaces (``registry.api``, ``registry.kubemq_api``) are served by
    Django and by the fast paths in ``node``, never imported by the gateway."""
    offenders = {
        name: sorted(i for i in _imports(path)
                     if i.startswith(("registry.api", "registry.kubemq_api")))
        for name, path in _modules("gateway").items()
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_the_layers_form_no_cycle():
    """The allowed edges themselves run one way (a topological order exists)."""
    order: list[str] = []
    remaining = {package: set(allowed) for package, allowed in LAYERS.items()}
    while remaining:
        ready = sorted(p for p, needs in remaining.items() if not needs - set(order))
        assert ready, f"the layers form a cycle among {sorted(remaining)}"
        order.extend(ready)
        for package in ready:
            del remaining[package]
    assert order[0] == "core" and order[-1] == "config"


def _cycles(package: str) -> list[list[str]]:
    modules = _modules(package)
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
    return cycles


def test_modules_inside_each_package_import_one_another_one_way():
    assert {package: _cycles(package) for package in LAYERS if _cycles(package)} == {}


#: The most lines a product module may have: past it a module holds more than one concern, and
#: a change to one of them conflicts with every change to the others.
MAX_MODULE_LINES = 600


def _product_modules() -> list[Path]:
    """Every module of the product: the packages of :data:`LAYERS`, the examples and scripts,
    and the top-level scripts; not the tests, the benches or the migrations."""
    found = list(ROOT.glob("*.py"))
    for folder in (*LAYERS, "examples", "scripts"):
        found.extend(path for path in (ROOT / folder).rglob("*.py")
                     if "migrations" not in path.relative_to(ROOT).parts)
    return found


def _oversized(paths: list[Path], limit: int, root: Path = ROOT) -> dict[str, int]:
    sizes = {path.relative_to(root).as_posix(): len(path.read_text().splitlines())
             for path in paths}
    return {name: size for name, size in sizes.items() if size > limit}


def test_no_product_module_is_above_the_line_limit():
    assert _oversized(_product_modules(), MAX_MODULE_LINES) == {}


def test_the_line_limit_check_sees_a_long_module(tmp_path):
    """The check above can fail: a module one line past the limit is reported, one at it is
    not."""
    (tmp_path / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (tmp_path / "short.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    found = _oversized(sorted(tmp_path.glob("*.py")), MAX_MODULE_LINES, root=tmp_path)
    assert found == {"long.py": MAX_MODULE_LINES + 1}


def test_the_import_check_sees_a_cycle(tmp_path):
    """The check above can fail: two modules importing each other inside functions."""
    (tmp_path / "a.py").write_text("def f():\n    from gateway import b\n")
    (tmp_path / "b.py").write_text("from gateway import a\n")
    assert "gateway.b" in _imports(tmp_path / "a.py")
    assert "gateway.a" in _imports(tmp_path / "b.py")


def test_the_layer_check_sees_an_upward_import(tmp_path):
    """And the layer check can fail: a registry module importing the gateway in a function
    is an edge ``registry -> gateway``, which :data:`LAYERS` does not allow."""
    (tmp_path / "m.py").write_text("def f():\n    from gateway import handler\n")
    targets = {name.split(".")[0] for name in _imports(tmp_path / "m.py")}
    assert "gateway" in targets and "gateway" not in LAYERS["registry"]


def test_type_checking_imports_do_not_count(tmp_path):
    (tmp_path / "m.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gateway import handler\n"
    )
    assert not any(name.startswith("gateway") for name in _imports(tmp_path / "m.py"))
