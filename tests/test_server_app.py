"""run.json is true at every moment. The ServerApp's run_federated against a grid that reads run.json
each time a round's model is about to leave the server (the next broadcast), and after a failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flwr.superlink.grid import InMemoryGrid

from apps.server_app import run_federated
from fl_app.checkpoint import resolve_resume
from fl_app.config import ConfigError, compose_config, noise_stream_key
from fl_app.privacy.accountants import compute_epsilon
from fl_app.releases import ReleaseLog
from tests.helpers import FakeGrid
from tests.strategies.conftest import task_identity  # noqa: F401  (flwr Messages need a task identity)

SIGMA, Q, M = 0.95, 0.25, 20
RUN = [
    "strategy=dp_fedavg",
    f"dataset.num_clients={M}",
    "dataset.max_train_samples=400",
    "dataset.max_test_samples=100",
    f"privacy.sample_rate={Q}",
    "num_rounds=3",
    "allow_virtual_deployment=true",  # FakeGrid counts as a real SuperLink (not the simulation engine)
]


class WatchingGrid(FakeGrid):
    """A deployment grid (not the simulation engine) that reads run.json whenever a round's messages go out, and
    fails in round ``fail_round``."""

    def __init__(self, out: Path, fail_round: int | None = None) -> None:
        super().__init__()
        self.out = out
        self.fail_round = fail_round
        self.seen: list[dict] = []

    def send_and_receive(self, messages, timeout=None):
        self.seen.append(json.loads((self.out / "run.json").read_text()))
        if len(self.seen) == self.fail_round:
            raise RuntimeError("the SuperLink went away")
        return super().send_and_receive(messages, timeout)


def test_run_json_states_what_was_released_before_every_broadcast_and_at_the_end(tmp_path: Path) -> None:
    grid = WatchingGrid(tmp_path)
    run_federated(grid, compose_config(RUN), tmp_path, progress=False)
    for released, meta in enumerate(grid.seen):  # before round t's broadcast: t - 1 models have left
        assert meta["status"] == "running"
        assert meta["rounds_released"] == meta["rounds_accounted"] == released
        assert meta["epsilon"] == (pytest.approx(compute_epsilon(SIGMA, Q, released, 1 / M)) if released else 0)
        assert meta["dp_guarantee"] == f"client-level ({meta['epsilon']:.4g}, {1 / M:.3g})-DP"
        # Settings resolved before the first write: against a real SuperLink, CSPRNG and no client statistics.
        assert meta["noise_source"] == meta["sampling_source"] == "os-csprng"
        assert meta["noise_stream"]["mode"] == "secure"  # no run shares the CSPRNG's noise
        assert meta["client_statistics"].startswith("none")
    final = json.loads((tmp_path / "run.json").read_text())
    assert final["status"] == "completed" and final["rounds_released"] == 3
    assert final["epsilon"] == pytest.approx(compute_epsilon(SIGMA, Q, 3, 1 / M))


def test_after_a_failure_run_json_keeps_the_epsilon_of_every_release(tmp_path: Path) -> None:
    grid = WatchingGrid(tmp_path, fail_round=3)
    with pytest.raises(RuntimeError, match="went away"):
        run_federated(grid, compose_config(RUN), tmp_path, progress=False)
    meta = json.loads((tmp_path / "run.json").read_text())
    assert meta["status"] == "failed" and "went away" in meta["error"]
    assert meta["rounds_released"] == 2  # not the 0 of the start
    assert meta["epsilon"] == pytest.approx(compute_epsilon(SIGMA, Q, 2, 1 / M))
    assert meta["dp_guarantee"] == f"client-level ({meta['epsilon']:.4g}, {1 / M:.3g})-DP"


def test_seeded_randomness_against_a_superlink_fails_before_any_message(tmp_path: Path) -> None:
    grid = WatchingGrid(tmp_path)
    with pytest.raises(ConfigError, match="allow_seeded_deployment"):
        run_federated(grid, compose_config([*RUN, "privacy.secure_noise=false"]), tmp_path, progress=False)
    assert grid.seen == []
    meta = json.loads((tmp_path / "run.json").read_text())
    assert meta["status"] == "failed" and "allow_seeded_deployment" in meta["error"]


def test_a_virtual_population_against_a_superlink_fails_before_any_message(tmp_path: Path) -> None:
    """population=virtual against a real SuperLink would send each SuperNode the ids of other sampled clients:
    refused before the first message unless allowed, run.json saying why."""
    grid = WatchingGrid(tmp_path)
    config = compose_config([*RUN[:-1], "allow_virtual_deployment=false"])
    with pytest.raises(ConfigError, match=r"population=virtual against a real SuperLink.*allow_virtual_deployment"):
        run_federated(grid, config, tmp_path, progress=False)
    assert grid.seen == []
    meta = json.loads((tmp_path / "run.json").read_text())
    assert meta["status"] == "failed" and "population=nodes" in meta["error"]


def test_an_allowed_virtual_population_against_a_superlink_states_what_supernodes_learn(tmp_path: Path) -> None:
    run_federated(WatchingGrid(tmp_path), compose_config([*RUN, "num_rounds=1"]), tmp_path, progress=False)
    meta = json.loads((tmp_path / "run.json").read_text())
    assert meta["status"] == "completed"
    assert "each SuperNode is sent the ids of the sampled clients" in meta["supernodes_learn"]
    assert "not against SuperNodes" in meta["supernodes_learn"]


def test_a_virtual_population_in_simulation_states_nothing_more(tmp_path: Path) -> None:
    class SimulationGrid(FakeGrid, InMemoryGrid):
        pass

    run_federated(SimulationGrid(), compose_config([*RUN, "num_rounds=1"]), tmp_path, progress=False)
    assert "supernodes_learn" not in json.loads((tmp_path / "run.json").read_text())


@pytest.mark.parametrize("stream", ["shared", "per_run"])
def test_run_json_says_which_runs_share_the_noise(tmp_path: Path, stream: str) -> None:
    """A seeded run's noise is the seed's (shared) or its config's (per_run); run.json says which."""
    seeded = ["privacy.secure_noise=false", "privacy.allow_seeded_deployment=true", "num_rounds=1", "seed=3"]
    config = compose_config([*RUN, *seeded, f"privacy.noise_stream={stream}"])
    run_federated(WatchingGrid(tmp_path), config, tmp_path, progress=False)
    claim = json.loads((tmp_path / "run.json").read_text())["noise_stream"]
    assert claim["mode"] == stream
    if stream == "shared":
        assert "seed=3" in claim["shared_with"] and "key" not in claim
    else:
        assert claim["key"] == noise_stream_key(config) is not None
        assert "independent" in claim["shared_with"]


# ----- a resume accounts the checkpoint and the release log before run.json's first write ------------------------


class NoNodes(WatchingGrid):
    """No SuperNode ever connects."""

    def get_node_ids(self) -> list[int]:
        return []


class FailsAtFirstPush(WatchingGrid):
    """A node for every client connects (``population=nodes``); the grid fails at the first push: the query that
    asks each node for its partition, before the first round."""

    def get_node_ids(self) -> list[int]:
        return list(range(1, M + 1))

    def push_messages(self, messages):
        raise RuntimeError("push failed")


class ReadsRunJsonOnContact(WatchingGrid):
    """Reads run.json when the run first asks for its nodes (after the ServerApp's first write), then fails."""

    def get_node_ids(self) -> list[int]:
        self.seen.append(json.loads((self.out / "run.json").read_text()))
        raise RuntimeError("the SuperLink went away")


def _killed_after_two_releases(out: Path) -> list[str]:
    """A run that released rounds 1 and 2 and died in round 3, with only the initial model checkpointed."""
    run = [*RUN, "checkpoint_every=10"]
    with pytest.raises(RuntimeError, match="went away"):
        run_federated(WatchingGrid(out, fail_round=3), compose_config(run), out, progress=False)
    return [*run, f"resume={out}", "round_timeout=1"]


def _assert_states_two_releases(meta: dict) -> None:
    assert meta["rounds_released"] == meta["rounds_accounted"] == 2
    assert meta["epsilon"] == pytest.approx(compute_epsilon(SIGMA, Q, 2, 1 / M))


@pytest.mark.parametrize(
    ("grid_class", "error", "extra"),
    [
        (NoNodes, "SuperNode", []),
        (FailsAtFirstPush, "push failed", ["population=nodes"]),
        (ReadsRunJsonOnContact, "went away", []),
    ],
    ids=["no-node-connects", "fails-at-first-push", "run-json-before-the-grid"],
)
def test_a_resume_that_fails_before_its_first_round_never_understates_epsilon(
    tmp_path: Path, grid_class: type, error: str, extra: list[str]
) -> None:
    resume = _killed_after_two_releases(tmp_path)
    grid = grid_class(tmp_path)
    with pytest.raises(Exception, match=error):
        run_federated(grid, compose_config([*resume, *extra]), tmp_path, progress=False)
    for meta in grid.seen:  # every write the grid could see
        _assert_states_two_releases(meta)
    final = json.loads((tmp_path / "run.json").read_text())
    assert final["status"] == "failed" and error in final["error"]
    _assert_states_two_releases(final)


# ----- a resume uses the randomness its checkpoint was made with, or is refused before any message -----------------


class KilledGrid(WatchingGrid):
    """A deployment grid on which the server is killed (SIGINT) while round ``crash_round``'s messages go out."""

    def __init__(self, out: Path, crash_round: int | None = None) -> None:
        super().__init__(out)
        self.crash_round = crash_round

    def send_and_receive(self, messages, timeout=None):
        if len(self.seen) + 1 == self.crash_round:
            raise KeyboardInterrupt("killed")
        return super().send_and_receive(messages, timeout)


class SimulationKilledGrid(KilledGrid, InMemoryGrid):
    """The same on Flower's simulation engine (an in-memory grid): ``secure_noise=auto`` resolves to seeded."""


RESUMED = {"dp_fedavg": [], "dp_ftrl_fedavg": ["privacy.sampling=available", "privacy.min_separation=2"]}


@pytest.mark.parametrize("strategy", list(RESUMED))
@pytest.mark.parametrize("first_on_simulation", [True, False], ids=["seeded-then-csprng", "csprng-then-seeded"])
def test_a_resume_under_other_randomness_is_refused_and_run_json_keeps_every_release(
    tmp_path: Path, strategy: str, first_on_simulation: bool
) -> None:
    """Killed in round 4 after round 3 was released and logged (checkpoint after round 2), then resumed on the other
    kind of grid, where ``secure_noise=auto`` resolves to the other randomness: re-running round 3 would release it
    again with independent noise. Refused before any message (DP-FTRL refuses a CSPRNG release past its checkpoint
    already when it is built, whatever the resumed randomness), and run.json still states round 3's ε."""
    run = [*RUN, f"strategy={strategy}", *RESUMED[strategy], "num_rounds=6", "checkpoint_every=2"]
    grids = (SimulationKilledGrid, KilledGrid) if first_on_simulation else (KilledGrid, SimulationKilledGrid)
    with pytest.raises(KeyboardInterrupt):
        run_federated(grids[0](tmp_path, crash_round=4), compose_config(run), tmp_path, progress=False)
    killed = json.loads((tmp_path / "run.json").read_text())
    assert killed["rounds_released"] == 3 and killed["epsilon"] > 0
    resumed_grid = grids[1](tmp_path)
    config = resolve_resume(compose_config([*run, f"resume={tmp_path}"]))
    with pytest.raises(ConfigError, match=r"Resume where the run was checkpointed|cannot release those rows"):
        run_federated(resumed_grid, config, tmp_path, progress=False)
    assert resumed_grid.seen == []  # nothing sent: the refusal came before the first message
    meta = json.loads((tmp_path / "run.json").read_text())
    assert meta["status"] == "failed"
    assert meta["rounds_released"] == 3
    assert meta["epsilon"] == pytest.approx(killed["epsilon"], rel=1e-12)  # never less than what was released
    assert [r.round for r in ReleaseLog(tmp_path).read()] == [1, 2, 3]


@pytest.mark.parametrize("strategy", list(RESUMED))
def test_a_resume_under_the_same_randomness_continues(tmp_path: Path, strategy: str) -> None:
    """The seeded resume on the simulation engine repeats round 3's logged release and finishes the run."""
    run = [*RUN, f"strategy={strategy}", *RESUMED[strategy], "num_rounds=6", "checkpoint_every=2"]
    with pytest.raises(KeyboardInterrupt):
        run_federated(SimulationKilledGrid(tmp_path, crash_round=4), compose_config(run), tmp_path, progress=False)
    config = resolve_resume(compose_config([*run, f"resume={tmp_path}"]))
    run_federated(SimulationKilledGrid(tmp_path), config, tmp_path, progress=False)
    meta = json.loads((tmp_path / "run.json").read_text())
    assert meta["status"] == "completed" and meta["rounds_released"] == 6
    assert [r.round for r in ReleaseLog(tmp_path).read()] == [1, 2, 3, 3, 4, 5, 6]


def test_a_run_in_which_no_client_trains_fails_with_its_cause_and_its_epsilon(tmp_path: Path) -> None:
    """Every client fails every round: the run stops after max_empty_rounds, run.json says failed with the cause,
    and states the ε of the noise-only models it released."""
    from fl_app.empty_rounds import NoUpdateAcceptedError

    with pytest.raises(NoUpdateAcceptedError):
        run_federated(FakeGrid("errors"), compose_config([*RUN, "num_rounds=6", "max_empty_rounds=2"]), tmp_path,
                      progress=False)  # fmt: skip
    meta = json.loads((tmp_path / "run.json").read_text())
    assert meta["status"] == "failed" and "no client update was accepted in 2 consecutive rounds" in meta["error"]
    assert meta["rounds_released"] == 2
    assert meta["epsilon"] == pytest.approx(compute_epsilon(SIGMA, Q, 2, 1 / M))
    assert not (tmp_path / "final_model.npz").exists()


def test_the_hydra_door_builds_the_strategy_once_before_any_grid(tmp_path: Path, monkeypatch) -> None:
    """apps/main.py's preflight prepares the run (the strategy built, so a config it refuses fails before Ray
    starts) and the ServerApp runs that same run: one strategy, one resolve of its settings."""
    import apps.server_app
    from apps.main import preflight

    built = []
    build = apps.server_app.build_strategy
    monkeypatch.setattr(apps.server_app, "build_strategy", lambda *a, **k: built.append(build(*a, **k)) or built[-1])
    server_run = preflight(compose_config(RUN), tmp_path)
    assert not (tmp_path / "run.json").exists()  # nothing is claimed before the run meets its grid
    result = server_run.run(WatchingGrid(tmp_path))
    assert len(built) == 1 and built[0] is server_run.strategy and built[0].rounds_completed == 3
    assert json.loads((tmp_path / "run.json").read_text())["strategy"] == "DPFedAvg"
    assert len(result.arrays)


def test_a_noise_multiplier_the_count_leaves_nothing_of_is_refused_when_the_run_is_prepared(tmp_path: Path) -> None:
    """What only the strategy's construction finds (here adaptive clipping's count taking all of σ) is found when the
    run is prepared: on the Hydra door, before Ray starts (exit 2)."""
    from apps.server_app import ServerRun

    config = compose_config([*RUN, "privacy.clipping=adaptive", "privacy.clipped_count_stddev=0.1"])
    with pytest.raises(ConfigError, match=r"privacy\.clipped_count_stddev=0\.1"):
        ServerRun.prepare(config, tmp_path, progress=False)
    assert not (tmp_path / "run.json").exists()
