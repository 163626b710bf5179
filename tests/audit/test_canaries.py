"""Canary clients inside a run (fl_app/audit/canaries.py, strategies/base.py): the real ``start()`` loop with fake
grids, a model of d = 20,000 parameters and no training, so that the released rounds are exactly the mechanism.

Pins: canaries leave sampling, σ, m, the accountant and the real clients' contributions untouched; a canary takes
the client mechanism path of its strategy; a mechanism that is broken on purpose inside the test (noise off while
the accountant counts σ; the client clip skipped) is caught as a violation, and the correct one is not.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message

from fl_app.audit.__main__ import main as audit_main
from fl_app.audit.canaries import AUDIT_FILE
from fl_app.checkpoint import load_checkpoint
from fl_app.config import CONF_DIR, ConfigError, compose_config
from fl_app.privacy import audit as stats
from fl_app.privacy import mechanisms as mech
from strategies.auditing import audit_report
from strategies.base import FederatedStrategy
from tests.audit.power import ClientPathGrid
from tests.helpers import CrashInRound, FakeGrid, build, flat, partition_of, reply, with_norm, zeros

SHAPES: list[tuple[int, ...]] = [(100, 150), (5000,)]  # d = 20,000
D = 20_000
C = 0.2


class HonestGrid(FakeGrid):
    """Every sampled client answers a fixed update of norm 2C that depends only on (round, partition)."""

    def __init__(self) -> None:
        super().__init__()
        self.round = 0

    def send_and_receive(self, messages: Any, timeout: float | None = None) -> list[Message]:
        messages = list(messages)
        for i, msg in enumerate(messages):
            msg.metadata.__dict__["_message_id"] = f"h{self.round}-{i}"
        self.round += 1
        pids = [partition_of(m) for m in messages]
        self.sent.append(sorted(pids))
        return [
            reply(pid, with_norm(SHAPES, 2 * C, seed=1000 * self.round + pid), to=msg)
            for pid, msg in zip(pids, messages, strict=True)
        ]


def _run(*overrides: str, grid: FakeGrid | None = None, rounds: int = 3, **kwargs: Any) -> FederatedStrategy:
    strategy = build("strategy=dp_fedavg", "dataset.num_clients=20", "privacy.sample_rate=0.5", *overrides, **kwargs)
    result = strategy.start(grid or FakeGrid(), ArrayRecord(zeros(SHAPES)), num_rounds=rounds)
    strategy.final_weights = result.arrays.to_numpy_ndarrays()  # type: ignore[attr-defined]
    return strategy


# ----- config -----------------------------------------------------------------------------------------------------

REFUSING = {"noisy_fedavg", "noisy_fedprox"}


@pytest.mark.parametrize("name", sorted(p.stem for p in (CONF_DIR / "strategy").glob("*.yaml")))
def test_every_strategy_accepts_canaries_or_refuses_them_with_one_message(name: str) -> None:
    overrides = [f"strategy={name}", "audit=canaries"]
    if name == "dp_fedsam_topk":
        overrides.append("privacy.placement=server")
    if name in REFUSING:
        with pytest.raises(ConfigError, match=r"audit\.canaries=500: allowed 0 with this strategy: Noisy-FedAvg"):
            compose_config(overrides)
    else:
        assert compose_config(overrides).audit.canaries == 500


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("audit.canaries=10", "audit.canaries"),
        ("audit.canaries=-1", "audit.canaries"),
        ("audit.canary_scale=0", "audit.canary_scale"),
        ("audit.confidence=1.0", "audit.confidence"),
        ("audit.every=-2", "audit.every"),
        ("+audit.colour=red", "audit"),
    ],
)
def test_bad_audit_values_fail_with_the_key_named(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose_config(["audit=canaries", override])


# ----- canaries leave everything else untouched -------------------------------------------------------------------


def test_canaries_change_neither_sampling_nor_sigma_m_epsilon_nor_the_real_clients_contribution() -> None:
    plain_grid, audited_grid = HonestGrid(), HonestGrid()
    plain = _run(grid=plain_grid)
    audited = _run("audit=canaries", "audit.canaries=200", grid=audited_grid)
    assert audited.auditor.canaries is not None and audited.auditor.result is not None
    assert plain_grid.sent == audited_grid.sent  # the same real clients, every round
    assert audited.noise_multiplier == plain.noise_multiplier
    assert audited.expected_clients == plain.expected_clients == 10.0
    assert audited.epsilon() == plain.epsilon()
    assert audited.auditor.result.accountant_epsilon == plain.epsilon()
    # Same seed, same noise, same real updates: the models differ by exactly the canaries' C·u_i / m.
    canaries = [i for t in range(1, 4) for i in audited.auditor.canaries.participants(t)]
    assert canaries, "no canary joined: the test would not test anything"
    seed = audited.auditor.canaries.seed
    expected = sum(stats.canary_direction(seed, i, D).astype(np.float64) * C / 10.0 for i in canaries)
    difference = flat(audited.final_weights) - flat(plain.final_weights)
    np.testing.assert_allclose(difference, expected, atol=1e-6)


def test_canaries_join_with_probability_q_and_half_of_them_are_inserted() -> None:
    strategy = build("strategy=dp_fedavg", "dataset.num_clients=20", "privacy.sample_rate=0.25", "audit=canaries",
                     "audit.canaries=2000")  # fmt: skip
    strategy.start(FakeGrid(), ArrayRecord(zeros(SHAPES)), num_rounds=20)
    audit = strategy.auditor.canaries
    assert audit is not None
    inserted = int(audit.inserted.sum())
    assert abs(inserted - 1000) < 4 * math.sqrt(500)
    joined = [len(audit.participants(t)) for t in range(1, 21)]
    assert abs(np.mean(joined) / inserted - 0.25) < 0.01
    assert all(set(audit.participants(t)) <= set(np.flatnonzero(audit.inserted)) for t in range(1, 21))
    again = build("strategy=dp_fedavg", "dataset.num_clients=20", "privacy.sample_rate=0.25", "audit=canaries",
                  "audit.canaries=2000")  # fmt: skip
    again.start(FakeGrid(), ArrayRecord(zeros(SHAPES)), num_rounds=3)
    assert again.auditor.canaries.participants(3) == audit.participants(3)  # seeded: a pure function of (seed, round)


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_canaries_are_drawn_by_the_code_that_samples_the_real_clients(sampling: str) -> None:
    """A sampler that takes three times the accounted rate (a bug set up here, in the test only) takes three times
    as many canaries too; the real clients' draw is the only other thing that changes."""

    real_poisson, real_fixed = mech.poisson_sample, mech.fixed_size_sample

    def canaries_joined(triple: bool) -> tuple[float, list[list[int]]]:
        grid = FakeGrid()
        strategy = build("strategy=dp_fedavg", "dataset.num_clients=100", "privacy.sample_rate=0.1",
                         f"privacy.sampling={sampling}", "audit=canaries", "audit.canaries=2000")  # fmt: skip
        with pytest.MonkeyPatch.context() as patch:
            if triple:
                patch.setattr(mech, "poisson_sample", lambda n, q, rng: real_poisson(n, min(1.0, 3 * q), rng))
                patch.setattr(mech, "fixed_size_sample", lambda n, k, rng: real_fixed(n, min(n, 3 * k), rng))
            strategy.start(grid, ArrayRecord(zeros(SHAPES)), num_rounds=10)
        audit = strategy.auditor.canaries
        assert audit is not None
        rate = float(np.mean([len(audit.participants(t)) for t in range(1, 11)])) / int(audit.inserted.sum())
        return rate, grid.sent

    rate, sent = canaries_joined(triple=False)
    tripled, sent_tripled = canaries_joined(triple=True)
    assert abs(rate - 0.1) < 0.01
    assert abs(tripled - 0.3) < 0.02
    assert np.mean([len(s) for s in sent_tripled]) > 2.5 * np.mean([len(s) for s in sent])
    if sampling == "fixed":
        assert all(len(s) == 10 for s in sent)


@pytest.mark.parametrize(
    ("strategy", "extra"),
    [
        ("dp_fedavg", ()),
        ("dp_fedsam", ()),
        ("dp_fedavg_blur", ()),
        ("dp_fedavg_blurs", ()),
        ("fed_smp_randk", ()),
        ("fed_smp_topk", ()),
        ("dp_fedsam_topk", ("privacy.placement=server",)),
        ("dp_fedavg", ("privacy.placement=client", "privacy.sampling=fixed")),
    ],
)
def test_a_canary_takes_the_client_mechanism_path_of_its_strategy(strategy: str, extra: tuple[str, ...]) -> None:
    s = build(f"strategy={strategy}", "dataset.num_clients=20", "privacy.sample_rate=0.5", "audit=canaries",
              "audit.canaries=40", "audit.canary_scale=10", *extra)  # fmt: skip
    s.start(FakeGrid(), ArrayRecord(zeros(SHAPES)), num_rounds=1)
    plan = s.plan_round(2, ArrayRecord(zeros(SHAPES)), ConfigRecord())
    updates = s.aggregator.canary_updates(plan)
    assert updates
    for index, update in updates:
        assert mech.global_l2_norm(update) <= C  # canary_scale = 10: the clip cut it from 10C to C
        raw = s.auditor.canaries.update(index)
        assert mech.global_l2_norm(raw) == pytest.approx(10 * C, rel=1e-5)
        if plan.mask is not None:  # Fed-SMP: nothing outside the round's mask
            outside = flat(mech.apply_mask(update, [~m for m in plan.mask]))
            assert not outside.any()
        if strategy in ("fed_smp_topk", "dp_fedavg_blurs"):  # the canary's own top-k before the clip
            kept = np.count_nonzero(flat(update)) / D
            assert kept == pytest.approx(s.config.strategy.sparsity, abs=0.01)


# ----- the audit catches a broken mechanism -----------------------------------------------------------------------

AUDITED = ("dataset.num_clients=20", "privacy.sample_rate=0.5", "privacy.noise_multiplier=3", "privacy.delta=1e-5",
           "audit=canaries", "audit.canaries=400")  # fmt: skip


def test_the_correct_mechanism_is_not_a_violation() -> None:
    """With zero real updates the rounds are the bare sampled Gaussian mechanism on the canaries: the worst case
    for the audit. The lower bound stays below the accountant's ε; the estimates, from only 400 canaries, are
    noisy (fitting two variances at small δ), so what must hold is that their intervals reach the accountant's ε,
    not the point values (the bare-mechanism accuracy of the estimate is pinned in tests/privacy/test_audit.py)."""
    strategy = _run(*AUDITED, rounds=5)
    result = strategy.auditor.result
    assert result is not None and result.round == 5
    assert not result.violation
    assert result.lower_bound.delta == 1e-5  # min(δ, 0.01 / K)
    assert result.accountant_epsilon_at_bound_delta == strategy.ledger.epsilon_at(1e-5)
    assert result.lower_bound.epsilon <= result.accountant_epsilon_at_bound_delta
    assert result.estimate_iterates.low <= result.accountant_epsilon
    assert result.estimate_final.low <= result.accountant_epsilon


def test_noise_switched_off_while_the_accountant_counts_sigma_is_a_violation(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_noise(*args: Any, **kwargs: Any) -> float:
        return 0.0

    monkeypatch.setattr(mech, "gaussian_noise_std", no_noise)
    monkeypatch.setattr(mech.noise, "gaussian_noise_std", no_noise)  # the package's own callers (the client top-up)
    strategy = _run(*AUDITED, rounds=5)
    result = strategy.auditor.result
    assert result is not None and result.violation
    assert result.lower_bound.epsilon > result.accountant_epsilon
    assert "PRIVACY VIOLATION" in caplog.text
    assert audit_report(strategy.config, strategy.auditor)["violation"] is True


def test_a_client_path_that_skips_the_clip_is_a_violation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Client placement (the server does not clip again), fixed-size sampling (replace-one: ε = 1.41 at σ = 10);
    each canary claims an update of 100·C, which only the client clip holds to C."""
    overrides = (*AUDITED, "privacy.placement=client", "privacy.sampling=fixed", "privacy.noise_multiplier=10",
                 "audit.canary_scale=100")  # fmt: skip
    assert not _run(*overrides, rounds=5, grid=ClientPathGrid()).auditor.result.violation  # the clip holds it to C

    def no_clip(update: list[np.ndarray], c: float) -> tuple[list[np.ndarray], float]:
        return [np.array(u) for u in update], 0.0

    monkeypatch.setattr("clients.recipes.mech.clip_update", no_clip)
    monkeypatch.setattr(mech.clipping, "clip_update", no_clip)  # the package's own callers (reclip)
    result = _run(*overrides, rounds=5, grid=ClientPathGrid()).auditor.result
    assert result is not None and result.violation


# ----- what the run writes, and resuming ----------------------------------------------------------------------------


def test_audit_npz_recomputes_to_what_the_run_reported_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    strategy = _run(*AUDITED, rounds=3, checkpoint_dir=tmp_path)
    assert (tmp_path / AUDIT_FILE).is_file()
    assert not list((tmp_path / "audit").glob("delta_*.npy"))  # dropped once the audit is saved
    assert audit_main([str(tmp_path)]) == 0
    printed = json.loads(capsys.readouterr().out.split("\nwrote ")[0])
    expected = {"round": 3, "accountant_epsilon": strategy.epsilon(), **strategy.auditor.result.record()}
    assert printed.pop("audit_violation") is expected.pop("audit_violation") is False
    assert printed == pytest.approx(expected)
    assert (tmp_path / "audit.png").stat().st_size > 10_000


def test_sparse_canaries_insert_their_sparse_direction_and_recompute_from_audit_npz(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``audit.support=s``: each canary is C·u_i on s coordinates (what it inserts is what is scored), the models
    differ by exactly those, and ``python -m fl_app.audit`` recomputes the run's numbers (fitted final-model null)."""
    plain = _run(grid=HonestGrid())
    sparse = _run(
        "audit=canaries", "audit.canaries=200", "audit.support=50", grid=HonestGrid(), checkpoint_dir=tmp_path
    )
    assert sparse.auditor.canaries is not None and sparse.auditor.result is not None
    canaries = [i for t in range(1, 4) for i in sparse.auditor.canaries.participants(t)]
    assert canaries
    for index in canaries[:3]:
        assert np.count_nonzero(flat(sparse.auditor.canaries.update(index))) == 50
    directions = (stats.sparse_canary_direction(sparse.auditor.canaries.seed, i, D, 50) for i in canaries)
    expected = sum(stats.to_dense(idx, val, D).astype(np.float64) * C / 10.0 for idx, val in directions)
    np.testing.assert_allclose(flat(sparse.final_weights) - flat(plain.final_weights), expected, atol=1e-6)
    assert audit_main([str(tmp_path)]) == 0
    printed = json.loads(capsys.readouterr().out.split("\nwrote ")[0])
    assert printed["audit_eps_estimate_final"] == pytest.approx(sparse.auditor.result.estimate_final.epsilon)
    assert printed["audit_eps_lower_bound"] == pytest.approx(sparse.auditor.result.lower_bound.epsilon)


def test_a_sparse_support_larger_than_the_model_is_refused() -> None:
    with pytest.raises(ValueError, match=r"audit\.support"):
        _run("audit=canaries", "audit.canaries=40", f"audit.support={D + 1}")


def test_audit_main_says_why_without_an_audit_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert audit_main([str(tmp_path)]) == 2
    assert "audit.canaries=0" in capsys.readouterr().err


def test_a_resumed_run_audits_like_an_uninterrupted_one(tmp_path: Path) -> None:
    """Scored at round 2, checkpointed at 3, killed in round 5: the resume scores round 3 from its kept delta and
    re-runs round 4 (seeded noise: the same release)."""
    run = (*AUDITED, "audit.every=2", "checkpoint_every=3")
    whole = _run(*run, rounds=5, checkpoint_dir=tmp_path / "whole")
    first = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        _run(*run, rounds=5, checkpoint_dir=first, grid=CrashInRound(5))
    checkpoint = load_checkpoint(first)
    assert checkpoint is not None and checkpoint.round == 3
    resumed = _run(*run, rounds=5, checkpoint_dir=first, resume_from=checkpoint)
    assert resumed.auditor.result is not None and whole.auditor.result is not None
    assert resumed.auditor.result.record() == whole.auditor.result.record()
