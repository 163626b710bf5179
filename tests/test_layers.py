"""The layers point one way (docs/architecture.md): choices ← protocol types ← privacy ← clients / strategies ← apps
and tools.

Read from the source (every ``import`` and ``from ... import``, at any depth, lazy ones included), so a new import
that crosses a layer fails here before it tangles the packages."""

from __future__ import annotations

import ast
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
    (("fl_app/choices.py",), ("fl_app", "clients", "strategies", "flwr", "torch"), ()),
    (
        ("fl_app/privacy/**/*.py",),
        ("clients", "strategies", "fl_app.client_app", "fl_app.server_app", "flwr"),
        # Flower's backend-independent accounting types (PrivacyAccountant, PrivacyConfig, GaussianPrivacyEvent, ...)
        # and its RdpAccountant (fl_app/privacy/accountants/): the interface the accountants speak, not the runtime.
        ("flwr.supercore.privacy_accounting",),
    ),
    (("fl_app/instructions.py",), ("clients", "strategies", "fl_app.privacy"), ()),
    (("fl_app/models.py", "fl_app/data/**/*.py", "fl_app/config/*.py"), ("clients", "strategies", "flwr"), ()),
    (("clients/*.py",), ("strategies", "fl_app.server_app"), ()),
    (("strategies/*.py",), ("clients", "fl_app.client_app", "fl_app.server_app"), ()),
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
