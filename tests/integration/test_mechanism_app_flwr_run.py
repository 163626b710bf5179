"""docs/architecture.md's recipe for a client mechanism, performed where it has to hold: a user's own mechanism,
registered in the module of a Flower app of their own (tests/integration/mechanism_app/), run by ``flwr run`` on a
real ``flower-superlink --simulation`` whose Ray workers load that app's ClientApp, so import the registration.

``ClientLevelDP(HalvedFedAvg(config))`` (each client halves its clipped update, the server doubles the average back)
releases DP-FedAvg's model bit for bit without noise, which it can only do if every client ran the halving: a
client without the registration fails its reply, one that skipped the step would send twice its share.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.processes import ROOT
from tests.integration.conftest import flwr_run_app

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

APP = ROOT / "tests" / "integration" / "mechanism_app"
ROUNDS = 2


def test_a_users_mechanism_registered_in_their_app_runs_on_the_ray_workers(
    shared_superlink: tuple[str, dict[str, str], Path],
) -> None:
    out = shared_superlink[2] / "halved"
    proc = flwr_run_app(shared_superlink, APP, f"out='{out}'", "num-supernodes=2 client-resources-num-cpus=1")
    printed = proc.stdout[-5000:] + proc.stderr[-3000:]
    assert proc.returncode == 0 and (out / "result.json").exists(), printed
    result = json.loads((out / "result.json").read_text())
    for name in ("halved", "dp_fedavg"):  # every sampled client's reply aggregated, m = 4 a round
        assert result[name] == {"rounds_released": ROUNDS, "aggregated": [4] * ROUNDS}, result
    models = np.load(out / "models.npz")
    layers = len([key for key in models.files if key.startswith("initial_")])
    halved = [models[f"halved_{i}"] for i in range(layers)]
    plain = [models[f"dp_fedavg_{i}"] for i in range(layers)]
    assert max(float(np.abs(h - models[f"initial_{i}"]).max()) for i, h in enumerate(halved)) > 0  # it trained
    for a, b in zip(halved, plain, strict=True):
        assert np.array_equal(a, b)
