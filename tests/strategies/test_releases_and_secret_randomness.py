"""Secret randomness (CSPRNG sampling, masks and client seeds; no seed in the train messages) and the write-ahead
release log that keeps ε counting every model released across crashes, at the strategy level."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord

from clients.local_update import client_generator
from fl_app.checkpoint import load_checkpoint
from fl_app.config import ConfigError
from fl_app.instructions import TrainInstructions
from fl_app.privacy import mechanisms as mech
from fl_app.privacy.accountants import compute_epsilon
from fl_app.releases import Release, ReleaseLog, ReleaseMismatchError, model_digest
from tests.helpers import CrashInRound, FakeGrid, build, partition_of, push, random_update, zeros

SHAPES = [(20, 30), (30,)]
POP = ("dataset.num_clients=1000", "privacy.sample_rate=0.5")


def _messages(strategy, server_round: int = 1):
    strategy.population.connect(FakeGrid(), timeout=1)
    return push(list(strategy.configure_train(server_round, ArrayRecord(zeros(SHAPES)), ConfigRecord(), FakeGrid())))


def test_secure_randomness_sends_no_seed_and_samples_differently_every_time():
    secure = [build("strategy=dp_fedavg", *POP, "privacy.secure_noise=true") for _ in range(2)]
    first, second = (_messages(s) for s in secure)
    for message in first:
        config = message.content["config"]
        assert "seed" not in config  # nothing a client receives re-derives the sampling or any noise
        assert TrainInstructions.from_config(dict(config)).seed is None
    ids = [sorted(partition_of(m) for m in ms) for ms in (first, second)]
    assert ids[0] != ids[1]  # same config, same round: equal with probability 2^-1000
    assert secure[0].dp_guarantee()["sampling_source"] == "os-csprng"

    seeded = [build("strategy=dp_fedavg", *POP) for _ in range(2)]
    a, b = (_messages(s) for s in seeded)
    assert [partition_of(m) for m in a] == [partition_of(m) for m in b]
    assert all(m.content["config"]["seed"] == 0 for m in a)
    assert seeded[0].dp_guarantee()["sampling_source"].startswith("seeded-prng")
    # configure_train resolved the settings for the grid it was given: FakeGrid is not the simulation engine, so
    # the claim says the seed went to the clients (before configure_train resolved them, it said "simulation").
    assert "DEPLOYMENT: the seed is sent to every sampled client" in seeded[0].dp_guarantee()["sampling_source"]


def test_fed_smp_round_masks_come_from_the_csprng_when_secure():
    secure = build("strategy=fed_smp_randk", *POP, "privacy.secure_noise=true")
    masks = [secure.round_mask(1, zeros(SHAPES), []) for _ in range(2)]
    assert [int(m.sum()) for m in masks[0]] == [mech.kept_count(600, 0.4), mech.kept_count(30, 0.4)]
    assert not all(np.array_equal(a, b) for a, b in zip(*masks, strict=True))
    seeded = build("strategy=fed_smp_randk", *POP)
    same = [seeded.round_mask(1, zeros(SHAPES), []) for _ in range(2)]
    assert all(np.array_equal(a, b) for a, b in zip(*same, strict=True))


def test_a_client_without_a_seed_shuffles_with_its_own():
    message = _messages(build("strategy=dp_fedavg", *POP, "privacy.secure_noise=true"))[0]
    ins = TrainInstructions.from_config(dict(message.content["config"]))
    perms = [torch.randperm(1000, generator=client_generator(ins, 3)).numpy() for _ in range(2)]
    assert not np.array_equal(*perms)


def test_secure_sampling_draws_have_the_stated_law():
    rng = mech.secure_rng()
    population, q = 200_000, 0.1
    freq = len(mech.poisson_sample(population, q, rng)) / population
    assert abs(freq - q) < 5 * np.sqrt(q * (1 - q) / population)
    counts = np.zeros(50)
    for _ in range(2000):
        chosen = mech.fixed_size_sample(50, 10, rng)
        assert len(np.unique(chosen)) == 10 and chosen.min() >= 0 and chosen.max() < 50
        counts[chosen] += 1
    expected = 2000 * 10 / 50  # 400 per index; a chi-square over 49 degrees of freedom, far tail at 100
    assert ((counts - expected) ** 2 / expected).sum() < 100


def _run(overrides, tmp, rounds, grid=None, resume=None):
    strategy = build(*overrides, checkpoint_dir=tmp, resume_from=resume)
    initial = ArrayRecord(random_update(SHAPES, 0.1, seed=0))
    strategy.start(grid or FakeGrid(), initial, num_rounds=rounds)
    return strategy


@pytest.mark.parametrize("secure", [True, False])
def test_every_release_is_accounted_across_a_crash_and_a_resume(tmp_path, secure):
    overrides = ["strategy=dp_fedavg", "dataset.num_clients=50", "privacy.sample_rate=0.2", "checkpoint_every=3",
                 f"privacy.secure_noise={str(secure).lower()}"]  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        _run(overrides, tmp_path, rounds=6, grid=CrashInRound(6))  # released 1..5, checkpointed after 3
    log = ReleaseLog(tmp_path)
    assert [r.round for r in log.read()] == [1, 2, 3, 4, 5]
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.round == 3 and ckpt.strategy_state["releases_logged"] == 3
    resumed = _run(overrides, tmp_path, rounds=6, resume=ckpt)  # re-runs 4, 5, 6
    rounds = [r.round for r in log.read()]
    assert rounds == [1, 2, 3, 4, 5, 4, 5, 6]
    # CSPRNG noise: rounds 4 and 5 released twice, with different noise: 8 releases. Seeded noise: the re-run
    # repeats the same releases, so ε is that of an uninterrupted 6-round run.
    released = 8 if secure else 6
    assert resumed.account.ledger.rounds == released
    assert resumed.epsilon() == pytest.approx(compute_epsilon(0.95, 0.2, released, 1 / 50), rel=1e-9)
    assert all(r.randomness == ("os-csprng" if secure else "seeded") for r in log.read())


def test_a_torn_last_line_is_not_a_release(tmp_path):
    log = ReleaseLog(tmp_path)
    log.append(Release(round=1, noise_multiplier=1.0, sample_rate=0.1, randomness="os-csprng"))
    with log.path.open("a") as fh:
        fh.write(json.dumps({"round": 2})[:7])  # the crash came mid-write, before the fsync returned
    assert [r.round for r in log.read()] == [1]
    assert log.since(0) == log.read() and log.since(1) == []


def test_non_private_runs_write_no_release_log(tmp_path):
    _run(["strategy=fedavg", "dataset.num_clients=50", "privacy.sample_rate=0.2"], tmp_path, rounds=2)
    assert not ReleaseLog(tmp_path).path.exists()


# ----- a seeded re-run must repeat its logged release, or it is refused ----------------------------------------

SEEDED = ["strategy=dp_fedavg", "dataset.num_clients=50", "privacy.sample_rate=0.2", "checkpoint_every=3"]


class NonzeroGrid(FakeGrid):
    """Every client answers the same small non-zero update: another content than FakeGrid's zero updates."""

    def send_and_receive(self, messages, timeout=None):
        replies = super().send_and_receive(messages, timeout)
        for r in replies:
            r.content["arrays"] = ArrayRecord([np.full_like(a, 1e-3) for a in r.content["arrays"].to_numpy_ndarrays()])
        return replies


def _crash_after_five_releases(tmp_path, overrides=SEEDED):
    with pytest.raises(KeyboardInterrupt):
        _run(overrides, tmp_path, rounds=6, grid=CrashInRound(6))  # released 1..5, checkpointed after 3
    return load_checkpoint(tmp_path)


def test_every_release_records_the_digest_of_the_model_it_released(tmp_path):
    strategy = _run(SEEDED, tmp_path, rounds=3)
    releases = ReleaseLog(tmp_path).read()
    assert [r.round for r in releases] == [1, 2, 3] and len({r.digest for r in releases}) == 3
    final = load_checkpoint(tmp_path)
    assert releases[-1].digest == model_digest(final.weights)
    assert strategy.dp_guarantee()["rounds_released"] == 3


def test_a_seeded_rerun_whose_model_differs_from_its_release_is_refused_before_it_leaves(tmp_path):
    ckpt = _crash_after_five_releases(tmp_path)
    before = ReleaseLog(tmp_path).read()
    # The re-run's replies differ from the first attempt's (a timeout, a failed worker): same seeded noise, other
    # content. Released, the two round-4 models would differ by a noise-free (S1 - S2)/m.
    with pytest.raises(ReleaseMismatchError, match="re-run round 4"):
        _run(SEEDED, tmp_path, rounds=6, grid=NonzeroGrid(), resume=ckpt)
    assert ReleaseLog(tmp_path).read() == before  # nothing of it was logged, broadcast or checkpointed
    assert load_checkpoint(tmp_path).round == 3


def test_a_seeded_rerun_that_repeats_its_release_is_counted_once_across_two_resumes(tmp_path):
    ckpt = _crash_after_five_releases(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        _run(SEEDED, tmp_path, rounds=6, grid=CrashInRound(3), resume=ckpt)  # re-runs 4, 5; dies in 6 again
    releases = ReleaseLog(tmp_path).read()
    assert [r.round for r in releases] == [1, 2, 3, 4, 5, 4, 5]
    assert [r.digest for r in releases[5:]] == [r.digest for r in releases[3:5]]  # the same models again
    resumed = _run(SEEDED, tmp_path, rounds=6, resume=load_checkpoint(tmp_path))
    assert resumed.account.ledger.rounds == 6 and resumed.account.rounds_released == 6
    assert resumed.epsilon() == pytest.approx(compute_epsilon(0.95, 0.2, 6, 1 / 50), rel=1e-9)


def test_seeded_releases_that_are_not_rerun_are_still_counted(tmp_path):
    ckpt = _crash_after_five_releases(tmp_path)
    # The resumed run ends after round 4 (here: fewer rounds asked for); round 5's model had left the server.
    resumed = _run(SEEDED, tmp_path, rounds=4, resume=ckpt)
    assert resumed.account.ledger.rounds == 5
    assert resumed.epsilon() == pytest.approx(compute_epsilon(0.95, 0.2, 5, 1 / 50), rel=1e-9)


def test_a_seeded_release_without_a_digest_cannot_be_resumed(tmp_path):
    ckpt = _crash_after_five_releases(tmp_path)
    lines = ReleaseLog(tmp_path).path.read_text().splitlines()
    old = [json.dumps({k: v for k, v in json.loads(line).items() if k != "digest"}) for line in lines]
    ReleaseLog(tmp_path).path.write_text("\n".join(old) + "\n")  # a log written before digests existed
    with pytest.raises(ReleaseMismatchError, match="without a model digest"):
        _run(SEEDED, tmp_path, rounds=6, resume=ckpt)


# ----- seeded randomness against a real SuperLink ----------------------------------------------------------------


def test_seeded_randomness_in_a_deployment_is_refused_unless_allowed_and_then_said_loudly(caplog):
    from flwr.superlink.grid import InMemoryGrid

    class SimulationGrid(FakeGrid, InMemoryGrid):
        def __init__(self) -> None:
            FakeGrid.__init__(self)

    initial = ArrayRecord(zeros(SHAPES))
    refused = build("strategy=dp_fedavg", *POP, "privacy.secure_noise=false", "privacy.allow_seeded_deployment=false")
    grid = FakeGrid()  # not the simulation engine: a real deployment to the strategy
    with pytest.raises(ConfigError, match="allow_seeded_deployment"):
        refused.start(grid, initial, num_rounds=1)
    assert grid.sent == []  # refused before any message (and its seed) went out

    simulated = build("strategy=dp_fedavg", *POP, "privacy.secure_noise=false", "privacy.allow_seeded_deployment=false")
    simulated.start(SimulationGrid(), initial, num_rounds=1)  # the seed stays inside the simulation
    assert simulated.dp_guarantee()["sampling_source"].startswith("seeded-prng (simulation")

    forced = build("strategy=dp_fedavg", *POP, "privacy.secure_noise=false", "privacy.allow_seeded_deployment=true")
    with caplog.at_level(logging.ERROR):
        forced.start(FakeGrid(), initial, num_rounds=1)
    assert "SEEDED RANDOMNESS IN A DEPLOYMENT" in caplog.text
    assert "not private against clients" in forced.dp_guarantee()["sampling_source"]


# ----- a resume draws from the randomness its checkpoint was made with ------------------------------------------


def test_the_checkpoint_records_its_randomness_and_an_older_one_is_judged_by_the_log(tmp_path):
    """A checkpoint states the randomness it was made with; one written before that field existed is judged by the
    releases logged after it: a seeded release past the checkpoint refuses a CSPRNG resume."""
    ckpt = _crash_after_five_releases(tmp_path)  # seeded; released 1..5, checkpoint after 3
    assert ckpt.strategy_state["randomness"] == "seeded"
    del ckpt.strategy_state["randomness"]  # as an older version wrote it
    secure = [o for o in SEEDED if not o.startswith("privacy.secure_noise")] + ["privacy.secure_noise=true"]
    grid = FakeGrid()
    with pytest.raises(ConfigError, match=r"made with seeded randomness; this run would draw from os-csprng"):
        _run(secure, tmp_path, rounds=6, grid=grid, resume=ckpt)
    assert grid.sent == []
    # The releases past the checkpoint were accounted when the strategy was built: ε never states less.
    refused = build(*secure, checkpoint_dir=tmp_path, resume_from=ckpt)
    assert refused.ledger.rounds == 5
