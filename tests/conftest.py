"""Suite-wide: how the suite shares the machine's cores (docs/testing.md).

``scripts/test.sh`` runs pytest with two pytest-xdist workers. Every ``integration`` test (a real Flower simulation
or deployment: Ray, SuperLink and SuperNode processes, round timeouts) lives in tests/integration/ and the scheduler
below hands them all to one worker as a single unit, so they run one at a time, in file order, as without xdist
(module fixtures stay shared); the in-process tests are spread over the workers one by one. A plain ``pytest`` run
(no ``-n``) is unaffected.

The grouping is a scheduler rather than ``xdist_group`` marks: ``--dist loadgroup`` carries the group in a rewritten
node id, which pytest 9.2 no longer honours (pytest-dev/pytest-xdist#1386), so the marks are silently ignored.
"""

from __future__ import annotations

from typing import Any

import pytest

INTEGRATION_DIR = "tests/integration/"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The scheduler sees node ids only: an integration test outside tests/integration/ would run beside another.
    marked = [item.nodeid for item in items if item.get_closest_marker("integration") is not None]
    stray = [nodeid for nodeid in marked if not nodeid.startswith(INTEGRATION_DIR)]
    if stray:
        raise pytest.UsageError(f"integration tests must live in {INTEGRATION_DIR}: {stray[:5]}")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class IntegrationTogether(LoadScopeScheduling):
        """One work unit for every test in tests/integration/, one per test elsewhere."""

        def _split_scope(self, nodeid: str) -> str:
            return INTEGRATION_DIR if nodeid.startswith(INTEGRATION_DIR) else nodeid

    return IntegrationTogether(config, log)
