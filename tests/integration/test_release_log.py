"""Issue 11 §3 in a real simulation: a run with CSPRNG noise is SIGKILLed between checkpoints and resumed; its ε
counts every noisy model that ever left the server, the re-run rounds included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fl_app.checkpoint import load_checkpoint
from fl_app.metrics import read_metrics
from fl_app.privacy.accounting import compute_epsilon
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
    "privacy.secure_noise=true",  # CSPRNG noise in simulation: a re-run round releases a new model
    "checkpoint_every=3",
    "eval_every=100",
]


def test_sigkill_between_checkpoints_then_resume_accounts_every_release(short_tmp: Path) -> None:
    # Killed once round 5 is released: after the checkpoint of round 3, before that of round 6.
    out = start_and_kill_when(short_tmp, RUN, lambda out: len(ReleaseLog(out).read()) >= 5, "round 5", timeout=400)
    released_before = [r.round for r in ReleaseLog(out).read()]
    assert released_before[:5] == [1, 2, 3, 4, 5] and len(released_before) <= 6
    checkpoint = load_checkpoint(out)
    assert checkpoint.round == 3

    proc2 = resume_run(short_tmp, out)
    assert proc2.returncode == 0, proc2.stdout[-3000:] + proc2.stderr[-3000:]
    releases = ReleaseLog(out).read()
    # Every release before the kill, then rounds 4..7 again: 4 and 5 (and 6, if it got out) left the server twice.
    assert [r.round for r in releases] == released_before + list(range(4, ROUNDS + 1))
    assert all(r.randomness == "os-csprng" and r.noise_multiplier == SIGMA for r in releases)
    epsilon = compute_epsilon(SIGMA, Q, len(releases), 1 / M)
    meta = json.loads((out / "run.json").read_text())
    assert meta["rounds_accounted"] == len(releases) > ROUNDS
    assert meta["epsilon"] == pytest.approx(epsilon, rel=1e-9)
    records = read_metrics(out / "metrics.jsonl")
    assert [r["round"] for r in records] == list(range(1, ROUNDS + 1))
    assert records[-1]["epsilon"] == pytest.approx(epsilon, rel=1e-9)
    assert records[-1]["epsilon"] > compute_epsilon(SIGMA, Q, ROUNDS, 1 / M)  # what a restart-blind count says
