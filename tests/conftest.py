"""Suite-wide: how the suite shares the machine's cores (docs/testing.md).

``scripts/test.sh`` runs pytest with two pytest-xdist workers. Every ``integration`` test (a real Flower simulation
or deployment: Ray, SuperLink and SuperNode processes, round timeouts) lives in tests/integration/, and the scheduler
below hands them out as two units, each run by one worker, in file order, as without xdist (module fixtures stay
shared): the simulations go first, to one worker; the other runs the in-process tests one by one, then the late unit
(the real deployments, SuperLink + SuperNodes, and two simulations moved there so that both workers finish together),
which starts last so that it never runs beside the in-process tests and beside a simulation at once. A plain
``pytest`` run (no ``-n``) is unaffected.

The grouping is a scheduler rather than ``xdist_group`` marks: ``--dist loadgroup`` carries the group in a rewritten
node id, which pytest 9.2 no longer honours (pytest-dev/pytest-xdist#1386), so the marks are silently ignored.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

INTEGRATION_DIR = "tests/integration/"
#: One unit, handed out after every other unit: the real deployments, and the Ray-cluster and own-ServerApp
#: simulations, which balance the two workers (on 2026-11-28 the simulations' unit took 21 min 19 s against 19 min 6 s
#: for the in-process tests and the deployments; these two took 75 s of the first).
LATE_UNIT_FILES = (
    "tests/integration/test_deployment.py",
    "tests/integration/test_deployment_privacy.py",
    "tests/integration/test_ray_cluster.py",
    "tests/integration/test_user_server_app.py",
)
LATE_UNIT = "tests/integration/late"


def pytest_configure(config: pytest.Config) -> None:
    """Each xdist worker's torch and native thread pools get its share of the cores (one each with two workers on two
    cores). Unpinned, two workers each ran torch on every core: OpenMP's threads spin while they wait, and on the
    2-core machine the in-process tests took 11 min 41 s, the slowest (a 2-round Noisy-FedProx run) 65 s against
    9.5 s alone. A run the tests start in a subprocess pins its own threads (Ray, the entry points)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        from fl_app.threads import limit_library_threads

        share = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(share)
        limit_library_threads(share)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The scheduler sees node ids only: an integration test outside tests/integration/ would run beside another.
    marked = [item.nodeid for item in items if item.get_closest_marker("integration") is not None]
    stray = [nodeid for nodeid in marked if not nodeid.startswith(INTEGRATION_DIR)]
    if stray:
        raise pytest.UsageError(f"integration tests must live in {INTEGRATION_DIR}: {stray[:5]}")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class IntegrationUnits(LoadScopeScheduling):
        """The late unit, one unit for the other integration tests, one per test elsewhere."""

        def _split_scope(self, nodeid: str) -> str:
            if nodeid.split("::")[0] in LATE_UNIT_FILES:
                return LATE_UNIT
            return INTEGRATION_DIR if nodeid.startswith(INTEGRATION_DIR) else nodeid

        def _assign_work_unit(self, node: Any) -> None:
            if len(self.workqueue) > 1 and next(iter(self.workqueue)) == LATE_UNIT:
                self.workqueue.move_to_end(LATE_UNIT)  # handed out last
            super()._assign_work_unit(node)

    return IntegrationUnits(config, log)


@pytest.fixture(scope="session")
def fashion_mnist() -> None:
    """Skips the tests that use it where Fashion-MNIST is not installed (``scripts/setup.sh`` installs it)."""
    from fl_app.data.datasets import FASHION_MNIST_SYSTEM_DIR, DatasetUnavailableError, load_dataset

    try:
        load_dataset("fashion_mnist")
    except DatasetUnavailableError:
        pytest.skip(f"Fashion-MNIST not installed ({FASHION_MNIST_SYSTEM_DIR})")
