"""Runs of one seed share their noise unless ``privacy.noise_stream=per_run``.

With the default ``shared``, seeded runs that differ only in strategy, C, σ (or anything else) draw the same
standardized noise every round: correlation 1.0, so two such models subtract to a noise-free difference. With
``per_run`` every noise draw (the server's, the clients', Noisy-FedAvg's absolute noise, adaptive clipping's and the
statistics' noisy counts) is keyed also by the run's config (:func:`fl_app.config.noise_stream_key`): other configs
draw independent noise, the same config (a re-run, a resume) the same. Sampling stays shared.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord

from clients.recipes import privatize_update
from fl_app.checkpoint import load_checkpoint, resolve_resume
from fl_app.config import compose_config, noise_stream_key
from fl_app.instructions import TrainInstructions
from fl_app.releases import ReleaseLog
from strategies.registry import build_strategy
from tests.helpers import CrashInRound, FakeGrid, build, delta, flat, prime, random_update, reply, zeros

SHAPES = [(20_000,), (20, 30)]
POP = ("dataset.num_clients=50", "privacy.sample_rate=0.2")
CLIENT = ("privacy.sampling=fixed", "privacy.placement=client")
PER_RUN = "privacy.noise_stream=per_run"
# |corr| of two independent standard normal vectors of n ≈ 2e4 coordinates: sd 1/√n ≈ 0.007; 0.05 is 7 sd.
INDEPENDENT = 0.05


def corr(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a, b)[0, 1])


def server_noise(*overrides: str) -> np.ndarray:
    """What round 1 adds to the average of zero updates (server placement): the server's noise, up to its scale."""
    strategy = build(*POP, *overrides)
    old = zeros(SHAPES)
    plan = prime(strategy, old, sampled=4)
    outcome = strategy.aggregator.aggregate(plan, [reply(pid, zeros(SHAPES)) for pid in range(4)])
    return flat(delta(outcome.new_weights, old))


def client_noise(*overrides: str, partition_id: int = 3) -> np.ndarray:
    """What client ``partition_id`` sends for a zero update in round 1 (its own noise), its instructions read back
    from the wire as a client reads them."""
    strategy = build(*POP, *overrides)
    sent = strategy.train_instructions(1).to_config_record()
    ins = TrainInstructions.from_config(dict(sent))
    assert ins.noise_key == strategy.noise_key
    update, _ = privatize_update(zeros(SHAPES), ins, partition_id)
    return flat(update)


# ----- the server's noise ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (("strategy=dp_fedavg",), ("strategy=dp_fedsam",)),
        (("strategy=dp_fedavg", "privacy.clip_norm=0.2"), ("strategy=dp_fedavg", "privacy.clip_norm=0.5")),
        (("strategy=dp_fedavg", "privacy.noise_multiplier=0.95"), ("strategy=dp_fedavg", "privacy.noise_multiplier=2")),
    ],
)
def test_per_run_server_noise_is_independent_across_configs_where_shared_noise_is_one_vector(first, second):
    shared = corr(server_noise(*first), server_noise(*second))
    assert shared == pytest.approx(1.0, abs=1e-6)  # the subtraction attack: one standardized vector, two scales
    per_run = corr(server_noise(*first, PER_RUN), server_noise(*second, PER_RUN))
    assert abs(per_run) < INDEPENDENT


def test_per_run_noise_is_the_same_for_the_same_config_and_differs_from_the_shared_stream():
    again = [server_noise("strategy=dp_fedavg", PER_RUN) for _ in range(2)]
    np.testing.assert_array_equal(*again)  # a re-run (or a resume) draws the same noise
    assert abs(corr(again[0], server_noise("strategy=dp_fedavg"))) < INDEPENDENT


def test_sampling_stays_shared_under_per_run():
    a = build(*POP, "strategy=dp_fedavg", PER_RUN)
    b = build(*POP, "strategy=dp_fedsam", "privacy.clip_norm=0.5", PER_RUN)
    assert a.noise_key != b.noise_key
    for server_round in (1, 2, 3):
        np.testing.assert_array_equal(a.sample_clients(server_round), b.sample_clients(server_round))


@pytest.mark.parametrize(
    ("setting", "stat"),
    [("privacy.clipping=adaptive", "fraction_clipped_noisy"), ("privacy.client_statistics=noisy", "noisy")],
)
def test_noisy_counts_are_keyed_too(setting, stat):
    """Adaptive clipping's and the statistics' noisy clipped counts: two runs that differ only in num_rounds."""

    def fraction(*overrides: str) -> float:
        strategy = build(*POP, "strategy=dp_fedavg", setting, *overrides)
        plan = prime(strategy, zeros(SHAPES), sampled=4)
        stats = strategy.aggregator.aggregate(plan, [reply(pid, zeros(SHAPES)) for pid in range(4)]).stats
        if stat == "noisy":
            stats = strategy.aggregator.published_statistics(1, stats)
        return float(stats["fraction_clipped_noisy"])

    assert fraction("num_rounds=3") == fraction("num_rounds=4")
    assert fraction("num_rounds=3", PER_RUN) != fraction("num_rounds=4", PER_RUN)
    assert fraction("num_rounds=3", PER_RUN) == fraction("num_rounds=3", PER_RUN)


# ----- the clients' noise (client placement, Noisy-FedAvg) --------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (("strategy=dp_fedavg", *CLIENT), ("strategy=dp_fedavg", *CLIENT, "privacy.clip_norm=0.5")),
        (("strategy=noisy_fedavg",), ("strategy=noisy_fedavg", "strategy.noise_std=0.02")),
    ],
)
def test_client_noise_is_keyed_by_the_run_through_the_instructions(first, second):
    assert corr(client_noise(*first), client_noise(*second)) == pytest.approx(1.0, abs=1e-6)
    assert abs(corr(client_noise(*first, PER_RUN), client_noise(*second, PER_RUN))) < INDEPENDENT
    np.testing.assert_array_equal(client_noise(*first, PER_RUN), client_noise(*first, PER_RUN))


def test_shared_and_secure_runs_send_no_noise_key():
    assert "noise_key" not in build(*POP, "strategy=dp_fedavg").train_instructions(1).to_config_record()
    secure = build(*POP, "strategy=dp_fedavg", PER_RUN, "privacy.secure_noise=true")
    assert secure.train_instructions(1).noise_key is None  # nothing seeded to key: the CSPRNG shares nothing


# ----- what run.json says -----------------------------------------------------------------------------------------


def test_the_claim_names_who_shares_the_noise():
    shared = build(*POP, "strategy=dp_fedavg", "seed=7").dp_guarantee()["noise_stream"]
    assert shared["mode"] == "shared" and "seed=7" in shared["shared_with"] and "per_run" in shared["shared_with"]
    per_run = build(*POP, "strategy=dp_fedavg", PER_RUN)
    claim = per_run.dp_guarantee()["noise_stream"]
    assert claim["mode"] == "per_run" and claim["key"] == per_run.noise_key == noise_stream_key(per_run.config)
    secure = build(*POP, "strategy=dp_fedavg", "privacy.secure_noise=true").dp_guarantee()["noise_stream"]
    assert secure["mode"] == "secure"


# ----- resume: the key comes from the stored config, and the re-run repeats its releases ---------------------------


def test_a_per_run_resume_draws_its_noise_again_and_repeats_its_releases(tmp_path):
    overrides = [*POP, "strategy=dp_fedavg", "checkpoint_every=3", PER_RUN]
    first = build(*overrides, checkpoint_dir=tmp_path)
    initial = ArrayRecord(random_update(SHAPES, 0.1, seed=0))
    with pytest.raises(KeyboardInterrupt):
        first.start(CrashInRound(6), initial, num_rounds=6)  # released 1..5, checkpointed after 3
    # The resumed run's config is the checkpoint's, with resume and output_dir rewritten: the same key.
    config = resolve_resume(compose_config([f"resume={tmp_path}"]))
    assert config.resume == config.output_dir == str(tmp_path.resolve())
    assert noise_stream_key(config) == first.noise_key
    resumed = build_strategy(config, checkpoint_dir=tmp_path, resume_from=load_checkpoint(tmp_path))
    resumed.start(FakeGrid(), initial, num_rounds=6)  # re-runs 4 and 5: refused if their models differed
    releases = ReleaseLog(tmp_path).read()
    assert [r.round for r in releases] == [1, 2, 3, 4, 5, 4, 5, 6]
    assert [r.digest for r in releases[5:7]] == [r.digest for r in releases[3:5]]
    assert resumed.account.ledger is not None and resumed.account.ledger.rounds == 6
