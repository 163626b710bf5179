"""Suite-wide: how the suite shares the machine's cores (docs/testing.md).

``scripts/test.sh`` runs pytest with two pytest-xdist workers and ``--dist loadgroup``. Every ``integration`` test
(a real Flower simulation or deployment: Ray, SuperLink and SuperNode processes, round timeouts) joins one group, so
the integration runs go to one worker, one at a time, as they would without xdist; the in-process tests share the
other worker. A run with ``-p no:xdist`` (or plain ``pytest``) is unaffected.
"""

from __future__ import annotations

import pytest

INTEGRATION_GROUP = "integration"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the group into the node id
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("integration") is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(INTEGRATION_GROUP))
