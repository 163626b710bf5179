"""Issue 11 §2–3 at the strategy level: secret randomness (CSPRNG sampling, masks and client seeds; no seed in the
train messages) and the write-ahead release log that keeps ε counting every model released across crashes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord

from clients.numpy_client import client_generator
from fl_app.checkpoint import load_checkpoint
from fl_app.instructions import TrainInstructions
from fl_app.privacy import mechanisms as mech
from fl_app.privacy.accounting import compute_epsilon
from fl_app.releases import Release, ReleaseLog
from tests.helpers import FakeGrid, build, push, random_update, zeros

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
    ids = [sorted(int(m.content["config"]["partition_id"]) for m in ms) for ms in (first, second)]
    assert ids[0] != ids[1]  # same config, same round: equal with probability 2^-1000
    assert secure[0].dp_guarantee()["sampling_source"] == "os-csprng"

    seeded = [build("strategy=dp_fedavg", *POP) for _ in range(2)]
    a, b = (_messages(s) for s in seeded)
    assert [m.content["config"]["partition_id"] for m in a] == [m.content["config"]["partition_id"] for m in b]
    assert all(m.content["config"]["seed"] == 0 for m in a)
    assert seeded[0].dp_guarantee()["sampling_source"].startswith("seeded-prng")
    assert "seed stays secret" in seeded[0].dp_guarantee()["sampling_source"]


def test_fed_smp_round_masks_come_from_the_csprng_when_secure():
    secure = build("strategy=fed_smp_randk", *POP, "privacy.secure_noise=true")
    secure._shapes = SHAPES
    masks = [secure.round_mask(1) for _ in range(2)]
    assert [int(m.sum()) for m in masks[0]] == [mech.kept_count(600, 0.4), mech.kept_count(30, 0.4)]
    assert not all(np.array_equal(a, b) for a, b in zip(*masks, strict=True))
    seeded = build("strategy=fed_smp_randk", *POP)
    seeded._shapes = SHAPES
    assert all(np.array_equal(a, b) for a, b in zip(seeded.round_mask(1), seeded.round_mask(1), strict=True))


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
    strategy = build(*overrides)
    initial = ArrayRecord(random_update(SHAPES, 0.1, seed=0))
    strategy.start(grid or FakeGrid(), initial, num_rounds=rounds, checkpoint_dir=tmp, resume_from=resume)
    return strategy


class CrashInRound(FakeGrid):
    """The server dies while round ``crash_round`` is under way (after the earlier rounds released their models)."""

    def __init__(self, crash_round: int) -> None:
        super().__init__()
        self.crash_round = crash_round

    def send_and_receive(self, messages, timeout=None):
        if len(self.sent) + 1 == self.crash_round:
            raise KeyboardInterrupt
        return super().send_and_receive(messages, timeout)


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
    assert resumed.accountant.steps == released
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
