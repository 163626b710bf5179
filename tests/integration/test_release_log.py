"""The release log and run.json across a crash, in a real simulation: a run is SIGKILLed between checkpoints and
resumed.

With CSPRNG noise its ε counts every noisy model that ever left the server, the re-run rounds included. With seeded
noise every re-run round repeats its logged release (same model digest): ε counts each release once. Right after the
kill, run.json already states the ε of every model that had left the server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fl_app.checkpoint import load_checkpoint
from fl_app.metrics import read_metrics
from fl_app.privacy.accountants import compute_epsilon
from fl_app.releases import ReleaseLog
from tests.integration.conftest import resume_run, start_and_kill_when

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ROUNDS, Q, SIGMA, M = 7, 0.25, 0.95, 20
RUN = [
    f"num_rounds={ROUNDS}",
    f"dataset.num_clients={M}",
    "dataset.max_train_samples=1200",
    "dataset.max_test_samples=500",
    f"privacy.sample_rate={Q}",
    "checkpoint_every=3",
    "eval_every=100",
]


def _run_json(out: Path) -> dict:
    path = out / "run.json"
    return json.loads(path.read_text()) if path.exists() else {}


@pytest.mark.parametrize("secure", [True, False], ids=["csprng", "seeded"])
def test_sigkill_between_checkpoints_then_resume_accounts_every_release(
    short_tmp: Path, secure: bool, shared_ray: str
) -> None:
    # Killed once run.json says round 5 was released: after the checkpoint of round 3, before that of round 6.
    run = [*RUN, f"privacy.secure_noise={str(secure).lower()}", shared_ray]
    out = start_and_kill_when(
        short_tmp, run, lambda out: _run_json(out).get("rounds_released", 0) >= 5, "round 5", timeout=400
    )
    released_before = ReleaseLog(out).read()
    assert [r.round for r in released_before][:5] == [1, 2, 3, 4, 5] and len(released_before) <= 6
    assert load_checkpoint(out).round == 3

    # run.json after the kill: still "running", and true — the ε of every model that had left the server (the log
    # may hold one more, written ahead of a model that had not left yet).
    killed = _run_json(out)
    assert killed["status"] == "running"
    assert killed["rounds_released"] == killed["rounds_accounted"] in (len(released_before), len(released_before) - 1)
    assert killed["epsilon"] == pytest.approx(compute_epsilon(SIGMA, Q, killed["rounds_released"], 1 / M), rel=1e-9)
    assert killed["dp_guarantee"] == f"client-level ({killed['epsilon']:.4g}, {1 / M:.3g})-DP"

    proc2 = resume_run(short_tmp, out)
    assert proc2.returncode == 0, proc2.stdout[-3000:] + proc2.stderr[-3000:]
    releases = ReleaseLog(out).read()
    # Every release before the kill, then rounds 4..7 again: 4 and 5 (and 6, if it got out) left the server twice.
    assert [r.round for r in releases] == [r.round for r in released_before] + list(range(4, ROUNDS + 1))
    assert all(r.randomness == ("os-csprng" if secure else "seeded") for r in releases)
    assert all(r.noise_multiplier == SIGMA for r in releases)
    first = {r.round: r.digest for r in released_before}
    rerun = {r.round: r.digest for r in releases[len(released_before) :]}
    if secure:
        # Fresh noise: the re-run rounds are new models, each a release of its own.
        assert all(rerun[t] != first[t] for t in first if t >= 4)
        distinct = len(releases)
        assert distinct > ROUNDS
    else:
        # Seeded noise: each re-run round released exactly the model it had released before the kill.
        assert all(rerun[t] == first[t] for t in first if t >= 4)
        distinct = ROUNDS
    epsilon = compute_epsilon(SIGMA, Q, distinct, 1 / M)
    meta = _run_json(out)
    assert meta["status"] == "completed"
    assert meta["rounds_accounted"] == meta["rounds_released"] == distinct
    assert meta["epsilon"] == pytest.approx(epsilon, rel=1e-9)
    records = read_metrics(out / "metrics.jsonl")
    assert [r["round"] for r in records] == list(range(1, ROUNDS + 1))
    assert records[-1]["epsilon"] == pytest.approx(epsilon, rel=1e-9)
    if secure:
        assert records[-1]["epsilon"] > compute_epsilon(SIGMA, Q, ROUNDS, 1 / M)  # what a restart-blind count says
