"""strategies/client_dp/budget.py: one release's events, the ledger's composition, the budget guard, resumes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fl_app.instructions import RecipeSpec
from fl_app.privacy.accountants import SampledGaussianEvent, compute_epsilon
from fl_app.privacy.ledger import SampledGaussianLedger
from fl_app.privacy.pipeline import Clip, mechanisms_for
from fl_app.releases import Release, model_digest
from strategies.client_dp import PrivacyBudget

SIGMA, RATE, DELTA = 1.1, 0.1, 1e-3


def budget(sigma: float = SIGMA, max_epsilon: float | None = None) -> PrivacyBudget:
    ledger = SampledGaussianLedger(DELTA, "rdp", "poisson", 100)
    return PrivacyBudget(ledger, mechanisms_for(RecipeSpec("dense")), noise_multiplier=sigma, sample_rate=RATE,
                         max_epsilon=max_epsilon)  # fmt: skip


def test_a_release_makes_the_pipelines_events_and_the_ledger_composes_them() -> None:
    spent = budget()
    assert spent.events() == [SampledGaussianEvent(SIGMA, RATE)]
    assert spent.events(2.0, 0.5) == [SampledGaussianEvent(2.0, 0.5)]  # a logged release keeps its own parameters
    for _ in range(3):
        spent.account()
    assert spent.released == 3 and spent.accountant.num_releases == 3
    assert spent.epsilon() == pytest.approx(compute_epsilon(SIGMA, RATE, 3, DELTA), rel=1e-12)
    assert spent.projected_epsilon() == pytest.approx(compute_epsilon(SIGMA, RATE, 4, DELTA), rel=1e-12)
    assert spent.accountant.num_releases == 3  # the question changes nothing


def test_a_pipeline_without_a_privacy_event_is_refused() -> None:
    unaccounted = PrivacyBudget(SampledGaussianLedger(DELTA, "rdp", "poisson", 100), [Clip()], noise_multiplier=SIGMA,
                                sample_rate=RATE)  # fmt: skip
    with pytest.raises(RuntimeError, match=r"no mechanism of the release's pipeline \(Clip\) makes a privacy event"):
        unaccounted.account()
    assert unaccounted.released == 0


def test_the_budget_guard_refuses_the_round_that_would_pass_max_epsilon() -> None:
    limit = compute_epsilon(SIGMA, RATE, 2, DELTA)
    guarded = budget(max_epsilon=limit)
    assert guarded.over_budget(1) is None
    guarded.account()
    assert guarded.over_budget(2) is None  # exactly at the limit is allowed
    guarded.account()
    reason = guarded.over_budget(3)
    third = compute_epsilon(SIGMA, RATE, 3, DELTA)
    assert reason == f"budget guard: round 3 would take epsilon to {third:.4f} > max_epsilon={limit}"
    assert budget().over_budget(1) is None  # no limit


def test_sigma_zero_is_accounted_as_infinite_epsilon() -> None:
    spent = budget(sigma=0.0, max_epsilon=10.0)
    assert spent.over_budget(1) is not None
    spent.account()
    assert spent.epsilon() == math.inf


def test_a_release_record_carries_what_is_accounted_and_the_models_digest() -> None:
    weights = [np.arange(6, dtype=np.float32).reshape(2, 3)]
    assert budget().release(4, weights, secure=True) == Release(4, SIGMA, RATE, "os-csprng", model_digest(weights))
    assert budget().release(4, weights, secure=False).randomness == "seeded"


def test_a_resume_continues_the_count_and_accounts_what_was_released_after_the_checkpoint() -> None:
    restored = budget()
    restored.account()  # what the checkpoint's ledger had counted
    owed = [Release(2, 2.0, 0.5, "os-csprng"), Release(3, SIGMA, RATE, "os-csprng")]
    restored.resume(released=1, owed=owed)
    assert restored.released == 3
    reference = SampledGaussianLedger(DELTA, "rdp", "poisson", 100)
    for sigma, rate in ((SIGMA, RATE), (2.0, 0.5), (SIGMA, RATE)):
        reference.compose(SampledGaussianEvent(sigma, rate))
    assert restored.ledger.state_dict() == reference.state_dict()
