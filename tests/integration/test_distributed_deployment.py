"""Distributed DP in a real deployment on 127.0.0.1: a TLS `flower-superlink`, three `flower-supernode`s (one client
each, `population=nodes`) and `flwr run` with `privacy=distributed`; a SuperNode is killed mid-run. The round goes on
with the survivors, the accounting does not move for the dropout, and what the server wrote holds released models
only (the messages themselves: tests/strategies/test_distributed_dp.py, on Flower's wire format)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from flwr.supercore.privacy_accounting import NeighboringRelation, PrivacyConfig, SamplingMethod

from bench.processes import stop_process_group
from fl_app.checkpoint import load_checkpoint
from fl_app.metrics import OPERATOR_FILE, read_metrics
from fl_app.privacy.accountants.skellam import SkellamAccountant, SkellamEvent
from fl_app.releases import model_digest
from tests.integration.deploy import deploy_run_config, deployment, start_flwr_run
from tests.integration.test_deployment import _assert_all_stopped, _assert_tls_only, _records

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

NODES = 3
OVERRIDES = "privacy=distributed strategy=dp_fedavg privacy.noise_multiplier=0.1"


def _expected_epsilons(meta: dict, rounds: int) -> tuple[float, float]:
    """(ε against the models' consumers, ε against the server) of ``rounds`` releases of the run's encoding,
    recomputed from what run.json states: the noise every round is the guaranteed minimum, whoever dropped."""
    d = meta["distributed"]
    event = SkellamEvent(
        (meta["noise_multiplier"] * d["l2_sensitivity"]) ** 2,
        d["l2_sensitivity"],
        d["l1_sensitivity"],
        meta["sample_rate"],
    )
    epsilons = []
    for method in (SamplingMethod.POISSON, SamplingMethod.NO_AMPLIFICATION):
        config = PrivacyConfig(
            target_delta=meta["delta"],
            population_size=NODES,
            neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
            sampling_method=method,
        )
        accountant = SkellamAccountant(config)
        accountant.compose(event, rounds)
        epsilons.append(accountant.get_epsilon(meta["delta"]))
    return epsilons[0], epsilons[1]


def test_a_tls_deployment_sums_securely_and_survives_a_node_killed_mid_run(short_tmp: Path) -> None:
    out = short_tmp / "out"
    run_config = deploy_run_config(out, NODES, num_rounds=2, extra="round_timeout=30", overrides=OVERRIDES)
    with deployment(short_tmp, NODES, tls=True) as dep:
        _assert_tls_only(dep)
        dep.logs["flwr run"] = short_tmp / "flwr_run.log"
        run = start_flwr_run(dep.env, dep.connection, run_config, dep.logs["flwr run"])
        try:
            deadline = time.monotonic() + 300
            while not _records(out):
                assert run.poll() is None, f"flwr run exited ({run.returncode}) before round 1\n{dep.tails()}"
                assert time.monotonic() < deadline, f"no round 1 after 300 s\n{dep.tails()}"
                time.sleep(0.2)
            dep.kill_supernode(2)  # SIGKILL its process group: the SuperNode, its SuperExec and ClientApp
            returncode = run.wait(timeout=400)
        finally:
            stop_process_group(run)
    context = dep.tails()
    assert returncode == 0, context
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "completed" and meta["placement"] == "distributed", context
    assert meta["noise_source"] == "os-csprng" and meta["rounds_accounted"] == 2, meta
    counts = read_metrics(out / OPERATOR_FILE)
    assert counts[0]["aggregated"] == NODES, counts
    assert all(c["aggregated"] == NODES - 1 for c in counts[1:]), counts  # the threshold t = 2 survives the dropout
    epsilon, server_epsilon = _expected_epsilons(meta, rounds=2)
    assert meta["epsilon"] == pytest.approx(epsilon, rel=1e-9)
    assert meta["server_epsilon"] == pytest.approx(server_epsilon, rel=1e-9)
    assert meta["epsilon"] == meta["server_epsilon"]  # q = 1: every client takes part, nothing amplifies
    # What the server wrote: model-sized arrays are released models only (every digest is in the release log).
    released = {json.loads(line)["digest"] for line in (out / "releases.jsonl").read_text().splitlines()}
    final = np.load(out / "final_model.npz")
    assert model_digest(final[k] for k in final.files) in released
    assert model_digest(load_checkpoint(out).weights) in released
    logs = "".join(path.read_text(errors="replace") for path in dep.logs.values() if path.exists())
    assert "reply rejected" not in logs and "aborted" not in logs, context
    _assert_all_stopped(dep)
