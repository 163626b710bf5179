"""The layers point one way (docs/architecture.md): choices ← protocol types ← privacy ← clients / strategies ← apps
and tools.

Read from the source (every ``import`` and ``from ... import``, at any depth, lazy ones included), so a new import
that crosses a layer fails here before it tangles the packages."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _files(*patterns: str) -> list[Path]:
    return sorted(p for pattern in patterns for p in ROOT.glob(pattern))


#: (files, packages they must not import, the exceptions: modules under a forbidden package they may import)
RULES = [
    (("fl_app/core/*.py",), ("fl_app", "clients", "strategies", "apps", "flwr", "torch"), ()),
    (
        ("fl_app/privacy/**/*.py",),
        ("clients", "strategies", "apps", "flwr"),
        # Flower's backend-independent accounting types (PrivacyAccountant, PrivacyConfig, GaussianPrivacyEvent, ...)
        # and its RdpAccountant (fl_app/privacy/accountants/): the interface the accountants speak, not the runtime.
        ("flwr.supercore.privacy_accounting",),
    ),
    (("fl_app/instructions.py",), ("clients", "strategies", "fl_app.privacy"), ()),
    (("fl_app/models.py", "fl_app/data/**/*.py", "fl_app/config/*.py"), ("clients", "strategies", "flwr"), ()),
    (("fl_app/**/*.py",), ("apps", "clients", "strategies"), ()),
    (("clients/*.py",), ("strategies", "apps"), ()),
    (("strategies/**/*.py",), ("clients", "apps"), ()),
]


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


@pytest.mark.parametrize(("patterns", "forbidden", "allowed"), RULES, ids=[r[0][0] for r in RULES])
def test_no_module_imports_a_higher_layer(
    patterns: tuple[str, ...], forbidden: tuple[str, ...], allowed: tuple[str, ...]
) -> None:
    files = _files(*patterns)
    assert files, patterns
    crossing = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in files
        for name in _imports(path)
        if _within(name, forbidden) and not _within(name, allowed)
    }
    assert not crossing, sorted(crossing)


def test_the_privacy_rule_covers_the_accountants_and_allows_only_flowers_accounting_types() -> None:
    patterns, forbidden, allowed = RULES[1]
    assert ROOT / "fl_app/privacy/accountants/registry.py" in _files(*patterns)
    assert _within("flwr.supercore.privacy_accounting.rdp_accountant", allowed)
    for name in ("flwr.serverapp", "flwr.supercore", "flwr.app", "flwr.supercore.privacy"):
        assert _within(name, forbidden) and not _within(name, allowed), name


#: The packages of the project, lowest first (fl_app: choices, protocol, privacy; apps: the ServerApp, ClientApp and
#: Hydra entry point).
PACKAGES = ("fl_app", "clients", "strategies", "apps")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    """Every module of the four packages → the project modules it imports (any depth, lazy and TYPE_CHECKING ones
    included; ``from package import name`` counts as the package's module or, if it is one, the submodule)."""
    modules = {_module_name(p): p for pattern in PACKAGES for p in ROOT.glob(f"{pattern}/**/*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets.add(node.module)
                targets.update(f"{node.module}.{a.name}" for a in node.names)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def test_no_import_cycle_between_modules() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                cycles.append([*stack[stack.index(target) :], target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    # A package's __init__ that re-exports its own submodules is not a cycle of ideas: drop package → own child.
    real = [
        c for c in cycles if not all(b.startswith(a + ".") or a.startswith(b + ".") for a, b in itertools.pairwise(c))
    ]
    assert not real, real[:5]


def test_the_folders_import_only_downward() -> None:
    rank = {package: i for i, package in enumerate(PACKAGES)}
    upward = sorted(
        f"{module} imports {target}"
        for module, targets in _graph().items()
        for target in targets
        if rank[target.split(".")[0]] > rank[module.split(".")[0]]
    )
    assert not upward, upward


def _folder(module: str) -> str:
    """A module's folder: a top-level package's own files, or one of its sub-packages (fl_app/privacy)."""
    path = ROOT / Path(*module.split("."))
    parts = (path if path.is_dir() else path.parent).relative_to(ROOT).parts
    return "/".join(parts[:2])


def test_no_import_cycle_between_folders() -> None:
    edges: dict[str, set[str]] = {}
    for module, targets in _graph().items():
        for target in targets:
            if _folder(target) != _folder(module):
                edges.setdefault(_folder(module), set()).add(_folder(target))

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            if node == goal:
                return True
            if node not in seen:
                seen.add(node)
                todo.extend(edges.get(node, ()))
        return False

    cycles = sorted(f"{a} <-> {b}" for a, targets in edges.items() for b in targets if a < b and reaches(b, a))
    assert not cycles, cycles
