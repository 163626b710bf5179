"""What a deployed distributed-DP run must show (tests/integration/test_deployment.py runs it with TLS and a
SuperNode killed mid-run): completed, both guarantees as recomputed from ``run.json``'s encoding — the noise of each
round accounted at the guaranteed minimum, whoever dropped — and nothing model-sized written but released models.
(The messages themselves: tests/strategies/test_distributed_dp.py, on Flower's wire format.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from flwr.supercore.privacy_accounting import NeighboringRelation, PrivacyConfig, SamplingMethod

from fl_app.checkpoint import load_checkpoint
from fl_app.privacy.accountants.skellam import SkellamAccountant, SkellamEvent
from fl_app.releases import model_digest


def expected_epsilons(meta: dict, population: int, rounds: int) -> tuple[float, float]:
    """(ε against the models' consumers, ε against the server) of ``rounds`` releases of the run's encoding."""
    d = meta["distributed"]
    l2 = d["l2_sensitivity"]
    event = SkellamEvent((meta["noise_multiplier"] * l2) ** 2, l2, d["l1_sensitivity"], meta["sample_rate"])
    epsilons = []
    for method in (SamplingMethod.POISSON, SamplingMethod.NO_AMPLIFICATION):
        config = PrivacyConfig(
            target_delta=meta["delta"],
            population_size=population,
            neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
            sampling_method=method,
        )
        accountant = SkellamAccountant(config)
        accountant.compose(event, rounds)
        epsilons.append(accountant.get_epsilon(meta["delta"]))
    return epsilons[0], epsilons[1]


def assert_distributed_run(out: Path, population: int, rounds: int, context: str) -> None:
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "completed" and meta["placement"] == "distributed", context
    assert meta["noise_source"] == "os-csprng" and meta["rounds_accounted"] == rounds, meta
    epsilon, server_epsilon = expected_epsilons(meta, population, rounds)
    assert meta["epsilon"] == pytest.approx(epsilon, rel=1e-9)
    assert meta["server_epsilon"] == pytest.approx(server_epsilon, rel=1e-9)
    if meta["sample_rate"] == 1.0:  # every client every round: nothing amplifies against anyone, no sample is short
        assert meta["epsilon"] == meta["server_epsilon"]
        assert meta["distributed"]["abort_probability"] == meta["distributed"]["abort_delta"] == 0.0
    # What the server wrote: model-sized arrays are released models only (every digest is in the release log).
    released = {json.loads(line)["digest"] for line in (out / "releases.jsonl").read_text().splitlines()}
    final = np.load(out / "final_model.npz")
    assert model_digest(final[k] for k in final.files) in released
    assert model_digest(load_checkpoint(out).weights) in released
