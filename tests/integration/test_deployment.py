"""Real deployments on 127.0.0.1: a `flower-superlink` (no simulation), one `flower-supernode` per client
(`population=nodes`, partition i on SuperNode i) and `flwr run` against them, insecure and with TLS, and a run that
loses a SuperNode mid-way."""

from __future__ import annotations

import itertools
import json
import subprocess
import time
from pathlib import Path

import pytest

from bench.processes import BIN, ROOT, stop_process_group
from fl_app.metrics import OPERATOR_FILE, read_metrics
from tests.integration.deploy import Deployment, deploy_run_config, deployment, flwr_run, start_flwr_run
from tests.integration.distributed_checks import assert_distributed_run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

NODES = 2
# With M = 2 clients the server's noise std σC/m is 0.475·C per coordinate at the default σ = 0.95: over the CNN's
# 1.66M weights that wrecks the model in round 1 and local training diverges (NaN) in round 2, so every reply fails.
# A smaller σ keeps these 2-client smoke runs learning; ε is large but accounted all the same.
SMALL_SIGMA = "privacy.noise_multiplier=0.1"
#: The TLS runs that lose a SuperNode: three, so that distributed DP's threshold t = 2 survives the loss.
KILL_NODES = 3
DISTRIBUTED = f"privacy=distributed strategy=dp_fedavg {SMALL_SIGMA}"


def _records(out: Path) -> list[dict]:
    """The complete lines of out/metrics.jsonl so far (the file may be mid-write)."""
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        try:
            records.append(json.loads(line))
        except ValueError:
            break
    return records


def _assert_completed(out: Path, rounds: int, context: str) -> list[dict]:
    assert (out / "run.json").exists(), context
    records = read_metrics(out / "metrics.jsonl")
    assert [r["round"] for r in records] == list(range(1, rounds + 1)), context
    epsilons = [r["epsilon"] for r in records]
    assert epsilons[0] > 0 and all(b > a for a, b in itertools.pairwise(epsilons)), epsilons
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "completed", meta.get("error")
    assert meta["strategy"] == "DPFedSAM"
    assert meta["config"]["population"] == "nodes"
    assert meta["dp_guarantee"].startswith("client-level (")
    assert meta["epsilon"] == pytest.approx(epsilons[-1])
    assert meta["noise_source"] == "os-csprng"  # privacy.secure_noise=auto against a real SuperLink
    assert (out / "final_model.npz").exists()
    return records


def _operator_counts(out: Path, rounds: int) -> list[dict]:
    """The client counts of each round: in deployment (client_statistics none) only in the operator's record."""
    counts = read_metrics(out / OPERATOR_FILE)
    assert [c["round"] for c in counts] == list(range(1, rounds + 1))
    assert not {"sampled", "aggregated", "failed"} & set(read_metrics(out / "metrics.jsonl")[0])  # not published
    return counts


def _assert_all_stopped(dep: Deployment) -> None:
    running = [p.args for p in dep.processes if p.poll() is None]
    assert not running, running
    assert dep.leftovers() == [], f"processes left behind: {dep.leftovers()}"


def _tail(text: str, chars: int = 4000) -> str:
    return text[-chars:]


def _wait_for_round_1(out: Path, started: dict[str, subprocess.Popen[bytes]], dep: Deployment) -> None:
    deadline = time.monotonic() + 300
    while not _records(out):
        for name, run in started.items():
            assert run.poll() is None, f"flwr run {name} exited ({run.returncode}) early\n{dep.tails()}"
        assert time.monotonic() < deadline, f"no round 1 in {out} after 300 s\n{dep.tails()}"
        time.sleep(0.2)


def _assert_tls_only(dep: Deployment) -> None:
    """The SuperLink really speaks TLS only: the same address through a plain-HTTP connection is refused."""
    config = Path(dep.env["FLWR_HOME"]) / "config.toml"
    address = config.read_text().split('address = "')[1].split('"')[0]
    config.write_text(config.read_text() + f'\n[superlink.plain]\naddress = "{address}"\ninsecure = true\n')
    plain = subprocess.run(
        [str(BIN / "flwr"), "supernode", "list", "plain", "--format", "json"],
        cwd=ROOT,
        env=dep.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    refused = json.loads(plain.stdout)
    assert refused["success"] is False, plain.stdout + plain.stderr
    assert "unavailable" in refused["error-message"], refused


# Slow: the default suite's deployments are test_deployment_privacy.py (insecure, 4 SuperNodes, two runs) and the
# TLS runs below, whose first round trains on every SuperNode before one of them dies.
@pytest.mark.slow
@pytest.mark.parametrize("tls", [False, True], ids=["insecure", "tls"])
def test_two_supernodes_train_dp_fedsam(short_tmp: Path, tls: bool) -> None:
    out = short_tmp / "out"
    run_config = deploy_run_config(out, NODES, num_rounds=2, overrides=SMALL_SIGMA)
    with deployment(short_tmp, NODES, tls=tls) as dep:
        if tls:
            _assert_tls_only(dep)
        proc = flwr_run(dep.env, dep.connection, run_config, timeout=400)
    context = f"flwr run:\n{_tail(proc.stdout)}\n{_tail(proc.stderr)}\n{dep.tails()}"
    assert proc.returncode == 0, context
    records = _assert_completed(out, rounds=2, context=context)
    for r, c in zip(records, _operator_counts(out, rounds=2), strict=True):
        assert c["sampled"] == c["received"] == c["aggregated"] == NODES, (c, context)
        assert c["failed"] == 0 and c["rejected_malformed"] == 0, (c, context)
        assert 0 <= r["test_accuracy"] <= 1
    link_log = dep.logs["superlink"].read_text(errors="replace")
    assert ("insecure HTTP server" in link_log) is not tls, _tail(link_log)
    _assert_all_stopped(dep)


def test_tls_runs_complete_when_a_node_dies_mid_run_central_and_distributed(short_tmp: Path) -> None:
    """Two runs on one TLS SuperLink with three SuperNodes, started together: distributed DP-FedAvg (secure
    aggregation; its own checks: tests/integration/distributed_checks.py) and DP-FedSAM (server placement, with more
    rounds: its rounds are shorter). Once both have released round 1, a SuperNode is killed; both complete with the
    two others. The timeouts leave room for round 1 of both on two shared cores."""
    rounds = {"distributed": 3, "central": 6}
    runs = {
        "distributed": deploy_run_config(short_tmp / "distributed", KILL_NODES, num_rounds=rounds["distributed"],
                                         extra="round_timeout=45", overrides=DISTRIBUTED),
        "central": deploy_run_config(short_tmp / "central", KILL_NODES, num_rounds=rounds["central"],
                                     extra="round_timeout=60", overrides=SMALL_SIGMA),
    }  # fmt: skip
    with deployment(short_tmp, KILL_NODES, tls=True) as dep:
        _assert_tls_only(dep)
        started = {}
        try:
            for name, run_config in runs.items():
                dep.logs[f"flwr run {name}"] = short_tmp / f"flwr_run_{name}.log"
                started[name] = start_flwr_run(dep.env, dep.connection, run_config, dep.logs[f"flwr run {name}"])
            for name in runs:
                _wait_for_round_1(short_tmp / name, started, dep)
            assert all(len(_records(short_tmp / name)) < rounds[name] for name in runs), dep.tails()  # mid-run
            dep.kill_supernode(KILL_NODES - 1)  # SIGKILL its process group: the SuperNode, its SuperExec, ClientApp
            returncodes = {name: run.wait(timeout=500) for name, run in started.items()}
        finally:
            for run in started.values():
                stop_process_group(run)
    context = dep.tails()
    assert returncodes == {"central": 0, "distributed": 0}, context
    assert "insecure HTTP server" not in dep.logs["superlink"].read_text(errors="replace"), context
    _assert_completed(short_tmp / "central", rounds=rounds["central"], context=context)
    for name in runs:
        counts = _operator_counts(short_tmp / name, rounds=rounds[name])
        assert counts[0]["aggregated"] == KILL_NODES and counts[0]["failed"] == 0, (name, counts[0], context)
        # The dead node's message times out, or the SuperLink answers it with "Node Unavailable" once the node
        # missed its heartbeats; either way it counts as failed and the round completes without it.
        assert counts[-1]["failed"] >= 1 and counts[-1]["aggregated"] == KILL_NODES - 1, (name, counts[-1], context)
        assert all(c["sampled"] == KILL_NODES for c in counts), (name, counts, context)
    assert_distributed_run(short_tmp / "distributed", KILL_NODES, rounds=rounds["distributed"], context=context)
    _assert_all_stopped(dep)
