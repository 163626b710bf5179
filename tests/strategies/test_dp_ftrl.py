"""DP-FTRL-FedAvg / DP-FTRL-FedSAM (strategies/dp_ftrl.py): the participation rule enforced and checkpointed, the
released noise exactly σC/m·C⁻¹z of the factorization, ε the factorization's bound (calibrated to a target), a
seeded resume that continues the noise stream bit for bit, and every refusal with its reason."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fl_app.checkpoint import load_checkpoint
from fl_app.config import ConfigError, compose_config
from fl_app.instructions import STREAM_SERVER_NOISE
from fl_app.privacy import mechanisms as mech
from fl_app.privacy.accountants import create_accountant, privacy_config
from fl_app.privacy.accountants.matrix_factorization import matrix_factorization_bound
from fl_app.privacy.correlated_noise import CorrelatedNoise
from fl_app.privacy.fdp import gdp_to_epsilon
from fl_app.privacy.mechanisms import matrix_factorization as mf
from fl_app.privacy.mechanisms.participation import ParticipationRecord, ParticipationRule
from strategies.dp_fedavg import DPFedAvg
from strategies.dp_ftrl import DPFTRLFedAvg, DPFTRLFedSAM
from tests.helpers import CrashInRound, FakeGrid, build, delta, flat, random_update
from tests.strategies.conftest import task_identity  # noqa: F401  (flwr Messages need a task identity)

SHAPES = [(4, 5), (5,)]
SMALL = ["dataset.num_clients=20", "privacy.sample_rate=0.25", "num_rounds=8"]  # b = 4 groups of 5, k = 2


def _run(strategy, rounds: int, grid: FakeGrid | None = None, shapes=SHAPES) -> list[list[np.ndarray]]:
    """Run ``rounds`` rounds on a grid whose clients answer zero updates; the global models after each round."""
    models: list[list[np.ndarray]] = []

    class Record:
        def round_completed(self, strategy, server_round, outcome, record) -> None:
            models.append([np.array(w, copy=True) for w in outcome.new_weights])

    strategy.observers.append(Record())
    strategy.start(grid or FakeGrid(), ArrayRecord(random_update(shapes, 0.1, seed=0)), num_rounds=rounds)
    return models


def test_the_default_sampler_of_dp_ftrl_is_cyclic_and_its_rule_comes_from_q() -> None:
    strategy = build("strategy=dp_ftrl_fedsam", *SMALL)
    assert isinstance(strategy, DPFTRLFedSAM) and strategy.local_optimizer == "sam"
    p = strategy.config.privacy
    assert (p.sampling, p.min_separation, p.max_participations) == ("cyclic", 4, 2)
    assert strategy.expected_clients == 5.0
    assert strategy.rule == ParticipationRule(4, 2)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["strategy=dp_ftrl_fedavg", "privacy.sampling=poisson"], "its accounting assumes one of these samplers"),
        (["strategy=dp_fedavg", "privacy.sampling=cyclic"], "its accounting assumes one of these samplers"),
        (["strategy=dp_fedavg", "privacy.min_separation=3"], "a participation rule is for sampling=cyclic"),
        (["strategy=dp_ftrl_fedavg", "privacy.sample_rate=0.3"], "1/min_separation"),
        (
            ["strategy=dp_ftrl_fedavg", "privacy.sampling=cyclic", "privacy.max_participations=1", "num_rounds=20"],
            "ceil(T/b)",
        ),
        (["strategy=dp_ftrl_fedavg", "privacy.placement=client", "privacy.sampling=available"], "cannot hold it"),
        (["strategy=dp_ftrl_fedsam", "privacy.clipping=adaptive"], "joint accounting"),
        (["strategy=dp_ftrl_fedavg", "strategy.factorization=toeplitz"], "blt | banded | identity"),
    ],
)
def test_a_sampler_that_disagrees_with_the_accounting_does_not_start(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        compose_config(overrides)


def test_refusals_at_construction_name_their_reason() -> None:
    with pytest.raises(ConfigError, match="not linear"):
        build("strategy=dp_ftrl_fedavg", "server_optimizer=adam", *SMALL)
    with pytest.raises(ConfigError, match="client_statistics=noisy"):
        build("strategy=dp_ftrl_fedavg", "privacy.client_statistics=noisy", *SMALL)
    with pytest.raises(ConfigError, match="an accountant cannot be given"):
        DPFTRLFedAvg(
            compose_config(["strategy=dp_ftrl_fedavg", *SMALL]),
            accountant=create_accountant("rdp", privacy_config(0.05, "poisson", 20)),
        )
    with pytest.raises(ValueError, match="bands"):
        build("strategy=dp_ftrl_fedavg", "strategy.factorization=banded", "strategy.bands=5", *SMALL)


@pytest.mark.parametrize("factorization", ["blt", "banded", "identity"])
def test_target_epsilon_calibrates_sigma_by_the_factorizations_bound(factorization: str) -> None:
    strategy = build("strategy=dp_ftrl_fedsam", f"strategy.factorization={factorization}",
                     "privacy.target_epsilon=4", *SMALL)  # fmt: skip
    p, f = strategy.config.privacy, strategy.factorization
    bound = matrix_factorization_bound(f.toeplitz, 8, 8, 4, 2, strategy.noise_multiplier, p.delta)
    assert 4 * (1 - 1e-3) <= bound.epsilon <= 4
    assert strategy.account.budget.projected_epsilon() == pytest.approx(
        matrix_factorization_bound(f.toeplitz, 8, 1, 4, 2, strategy.noise_multiplier, p.delta).epsilon, rel=1e-12
    )
    assert bound.epsilon == pytest.approx(gdp_to_epsilon(bound.mu, p.delta), rel=1e-12)
    assert bound.rho == pytest.approx(bound.mu**2 / 2)
    if factorization == "identity":  # k = 2 compositions of the Gaussian mechanism at sigma
        assert bound.mu == pytest.approx(math.sqrt(2) / strategy.noise_multiplier, rel=1e-12)


def test_cyclic_rounds_enforce_the_rule_and_epsilon_is_the_bound_after_each_round(tmp_path: Path) -> None:
    strategy = build("strategy=dp_ftrl_fedavg", *SMALL, "checkpoint_every=1", checkpoint_dir=tmp_path)
    grid = FakeGrid()
    _run(strategy, 8, grid)
    record = ParticipationRecord(ParticipationRule(4, 2))
    for server_round, clients in enumerate(grid.sent, start=1):
        assert len(clients) == 5
        record.record(clients, server_round)  # raises on any violation of the rule
    assert strategy.participation_sampler.record == record and len(record) == 20
    f = strategy.factorization
    bound = matrix_factorization_bound(f.toeplitz, 8, 8, 4, 2, strategy.noise_multiplier, strategy.config.privacy.delta)
    assert strategy.epsilon() == pytest.approx(bound.epsilon, rel=1e-12)
    state = load_checkpoint(tmp_path).strategy_state
    restored = ParticipationRecord(ParticipationRule(4, 2))
    restored.load_state_dict(json.loads(json.dumps(state["participation"])))
    assert restored == record
    claim = strategy.dp_guarantee()
    assert claim["participation_rule"] == "each client at most k=2 times, at least b=4 rounds apart"
    assert claim["amplification"].startswith("none") and "rounds apart" in claim["dp_guarantee"]


@pytest.mark.parametrize("factorization", ["blt", "banded", "identity"])
def test_the_released_noise_is_sigma_c_over_m_times_c_inverse_z(factorization: str) -> None:
    """Zero updates: round t's model change is exactly σC/m·(C⁻¹Z)_t, Z the seeded server-noise draws."""
    strategy = build("strategy=dp_ftrl_fedavg", f"strategy.factorization={factorization}", *SMALL)
    initial = random_update(SHAPES, 0.1, seed=0)
    models = _run(strategy, 8)
    changes = np.stack([flat(delta(new, old)) for new, old in zip(models, [initial, *models[:-1]], strict=True)])
    rngs = [
        strategy.randomness.noise_rng(t, STREAM_SERVER_NOISE) for t in range(1, 9)
    ]  # one stream a round, tensor by tensor
    z = np.stack([np.concatenate([rng.normal(0.0, 1.0, size=s).ravel() for s in SHAPES]) for rng in rngs])
    c = mf.toeplitz_matrix(strategy.factorization.toeplitz, 8)
    p = strategy.config.privacy
    expected = p.noise_multiplier * p.clip_norm / strategy.expected_clients * np.linalg.solve(c, z)
    np.testing.assert_allclose(changes, expected, rtol=1e-4, atol=1e-6)  # float32 models


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stop=st.integers(1, 7), factorization=st.sampled_from(["blt", "banded"]))
def test_a_seeded_resume_continues_the_noise_stream_bit_for_bit(
    tmp_path_factory: pytest.TempPathFactory, stop: int, factorization: str
) -> None:
    overrides = ["strategy=dp_ftrl_fedavg", f"strategy.factorization={factorization}", *SMALL, "checkpoint_every=1"]
    whole = _run(build(*overrides), 8)
    directory = tmp_path_factory.mktemp("resume")
    stopped = build(*overrides, checkpoint_dir=directory)
    _run(stopped, stop)
    checkpoint = load_checkpoint(directory)
    assert checkpoint.round == stop
    resumed = build(*overrides, checkpoint_dir=directory, resume_from=checkpoint)
    # The record comes back with the buffers.
    assert resumed.participation_sampler.record == stopped.participation_sampler.record
    rest = _run(resumed, 8)
    assert len(rest) == 8 - stop
    for a, b in zip(whole[-1], rest[-1], strict=True):
        assert np.array_equal(a, b)  # bit for bit
    assert resumed.epsilon() == pytest.approx(build(*overrides).privacy_bound(8).epsilon, rel=1e-12)


def test_the_available_sampler_refuses_clients_the_rule_does_not_allow() -> None:
    """Every client asks every round (all are available); the rule lets each in at most k times, b rounds apart,
    and the refusals are counted in the round's record."""
    strategy = build("strategy=dp_ftrl_fedavg", "privacy.sampling=available", "dataset.num_clients=6",
                     "privacy.sample_rate=0.5", "privacy.min_separation=2", "num_rounds=6",
                     "privacy.max_participations=2")  # fmt: skip
    grid = FakeGrid()
    _run(strategy, 6, grid)
    record = ParticipationRecord(ParticipationRule(2, 2))
    for server_round, clients in enumerate(grid.sent, start=1):
        assert len(clients) <= 3
        record.record(clients, server_round)
    assert sum(len(c) for c in grid.sent) <= 6 * 2  # no client more than k = 2 times
    assert strategy.participation_sampler.refused_last_round > 0


def test_a_seeded_run_of_dp_ftrl_differs_from_dp_fedavg_only_in_its_noise() -> None:
    """The identity factorization is DP-FedAvg's noise law (independent N(0, σ²C²/m²) a round) on the same draws."""
    ftrl = build("strategy=dp_ftrl_fedavg", "strategy.factorization=identity", *SMALL)
    fedavg = build("strategy=dp_fedavg", "dataset.num_clients=20", "privacy.sample_rate=0.25", "num_rounds=8")
    assert isinstance(fedavg, DPFedAvg)
    first_ftrl, first_fedavg = _run(ftrl, 1)[0], _run(fedavg, 1)[0]
    for a, b in zip(first_ftrl, first_fedavg, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-7)


def test_a_csprng_release_after_the_checkpoint_cannot_be_resumed(tmp_path: Path) -> None:
    """The server dies in round 4 after round 3 was released from the CSPRNG; the checkpoint is round 2's. Re-running
    round 3 would release that row of the factorization a second time with fresh noise: refused."""
    overrides = ["strategy=dp_ftrl_fedavg", *SMALL, "checkpoint_every=2", "privacy.secure_noise=true"]
    with pytest.raises(KeyboardInterrupt):
        _run(build(*overrides, checkpoint_dir=tmp_path), 8, CrashInRound(4))
    checkpoint = load_checkpoint(tmp_path)
    assert checkpoint.round == 2
    with pytest.raises(ConfigError, match="cannot release those rows"):
        build(*overrides, checkpoint_dir=tmp_path, resume_from=checkpoint)


def test_the_mechanism_keeps_model_sized_buffers_in_the_checkpoint(tmp_path: Path) -> None:
    strategy = build("strategy=dp_ftrl_fedavg", *SMALL, "checkpoint_every=1", checkpoint_dir=tmp_path)
    _run(strategy, 2)
    checkpoint = load_checkpoint(tmp_path)
    (buffers,) = [v for k, v in checkpoint.strategy_arrays.items() if k.startswith("mechanism_")]
    assert buffers[0].shape == (strategy.factorization.state_vectors, sum(math.prod(s) for s in SHAPES))
    noise_state = checkpoint.strategy_state["mechanisms"][-1]["correlated_noise"]
    assert noise_state["releases"] == 2 and noise_state["factorization"]["name"] == "blt"
    assert mech.global_l2_norm([buffers[0]]) > 0


def test_the_budget_guard_stops_before_the_row_that_would_pass_max_epsilon() -> None:
    """ε of the BLT arm jumps when the first clients can take part a second time (round b + 1 = 5): a budget between
    the two values lets rounds 1-4 run and stops before round 5."""
    probe = build("strategy=dp_ftrl_fedavg", *SMALL)
    before, after = probe.privacy_bound(4).epsilon, probe.privacy_bound(5).epsilon
    assert before < after
    strategy = build("strategy=dp_ftrl_fedavg", *SMALL, f"privacy.max_epsilon={(before + after) / 2}")
    grid = FakeGrid()
    _run(strategy, 8, grid)
    assert len(grid.sent) == 4 and strategy.stop_reason is not None and "budget guard" in strategy.stop_reason
    assert strategy.epsilon() == pytest.approx(before, rel=1e-12)


AUDIT_SHAPES = [(100, 150), (5000,)]  # d = 20,000: room for 400 canary directions
AUDITED = ("strategy=dp_ftrl_fedavg", "dataset.num_clients=20", "privacy.sample_rate=0.5", "num_rounds=5",
           "privacy.noise_multiplier=10", "privacy.delta=1e-5", "audit=canaries", "audit.canaries=400")  # fmt: skip


def test_canaries_follow_the_rule_and_the_audit_holds_for_the_correct_mechanism() -> None:
    """The canaries are sampled by the same cyclic groups (b = 2, k = 3 in 5 rounds); with zero real updates the
    rounds are the bare mechanism on the canaries, and the one-run lower bound stays below the factorization's ε."""
    strategy = build(*AUDITED)
    _run(strategy, 5, shapes=AUDIT_SHAPES)
    audit, result = strategy.auditor.canaries, strategy.auditor.result
    assert audit is not None and result is not None and result.round == 5
    record = ParticipationRecord(ParticipationRule(2, 3))
    for server_round in range(1, 6):
        record.record(audit.participants(server_round), server_round)  # raises on a violation of the rule
    assert {len(record.rounds_of(int(i))) for i in np.flatnonzero(audit.inserted)} == {2, 3}
    assert result.accountant_epsilon == pytest.approx(strategy.epsilon(), rel=1e-12)
    assert not result.violation


def test_the_audit_flags_a_dp_ftrl_build_whose_noise_is_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """A weakened build: the mechanism adds nothing while the ledger still accounts σ = 10 — the canaries catch it."""
    monkeypatch.setattr(CorrelatedNoise, "_correlate", lambda self, z: np.zeros_like(z))
    strategy = build(*AUDITED)
    _run(strategy, 5, shapes=AUDIT_SHAPES)
    result = strategy.auditor.result
    assert result is not None and result.violation
    assert result.lower_bound.epsilon > result.accountant_epsilon_at_bound_delta


# ----- every (T, b, k, factorization) builds or is refused with the setting to change -------------------------


def _builds_or_is_refused(rounds: int, b: int, k: int, factorization: str, buffers: int, bands: int | None) -> None:
    overrides = ["strategy=dp_ftrl_fedavg", "dataset.num_clients=20", "privacy.sample_rate=0.25",
                 "privacy.sampling=available", f"num_rounds={rounds}", f"privacy.min_separation={b}",
                 f"privacy.max_participations={k}", f"strategy.factorization={factorization}",
                 f"strategy.buffers={buffers}", f"strategy.bands={'null' if bands is None else bands}"]  # fmt: skip
    try:
        strategy = build(*overrides)
    except ConfigError as exc:
        assert "strategy." in str(exc) or "privacy." in str(exc) or "num_rounds" in str(exc)  # names a setting
        return
    f = strategy.factorization
    coefficients = f.toeplitz
    assert coefficients[0] == 1.0 and np.all(np.isfinite(coefficients))
    if f.blt is not None and rounds == 1:  # one row: C = I, the BLT with zero scales and decays
        assert set(f.blt.output_scale) | set(f.blt.buf_decay) <= {0.0}
    elif f.blt is not None:  # inside the optimiser's documented domain: θ > 0, ω in (0, 1), Σθ < 1
        assert all(t > 0 for t in f.blt.output_scale) and sum(f.blt.output_scale) < 1
        assert all(0 < w < 1 for w in f.blt.buf_decay)
        assert np.all(coefficients >= 0) and np.all(np.diff(coefficients) <= 0)
    bound = strategy.privacy_bound(rounds)
    assert math.isfinite(bound.sensitivity) and bound.sensitivity >= 1 and math.isfinite(bound.epsilon)


@pytest.mark.parametrize(("rounds", "b", "k"), [(12, 3, 2), (24, 7, 2), (17, 3, 3)])
def test_the_blt_configurations_whose_optimum_wants_a_decay_of_one_build(rounds: int, b: int, k: int) -> None:
    """The optimiser's sigmoid used to round such a decay to exactly 1.0, which the BLT refuses (a crash at
    construction); its bounds now keep ω < 1 in float64."""
    _builds_or_is_refused(rounds, b, k, "blt", 3, None)


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    rounds=st.integers(1, 24),
    b=st.integers(1, 10),
    k=st.integers(1, 4),
    factorization=st.sampled_from(["blt", "banded", "identity"]),
    buffers=st.integers(1, 4),
    bands=st.none() | st.integers(1, 12),
)
def test_every_small_configuration_builds_or_is_refused_with_a_message(
    rounds: int, b: int, k: int, factorization: str, buffers: int, bands: int | None
) -> None:
    _builds_or_is_refused(rounds, b, k, factorization, buffers, bands)
