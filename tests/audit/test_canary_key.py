"""The canaries' key is not derivable from anything sent to clients in a deployment. The run's seed
goes to every client as the data layout's seed (``partition_seed``); under secure randomness the canaries are keyed
by the OS CSPRNG instead (kept in the checkpoint, so a resume audits the same canaries), and only a seeded
simulation keys them by the seed (reproducible)."""

from __future__ import annotations

from pathlib import Path

from flwr.app import ArrayRecord

from fl_app.checkpoint import load_checkpoint
from fl_app.instructions import TrainInstructions
from tests.helpers import FakeGrid, build, random_update
from tests.strategies.conftest import task_identity  # noqa: F401  (flwr Messages need a task identity)

SHAPES = [(4, 5), (5,)]
RUN = ["strategy=dp_fedavg", "dataset.num_clients=20", "privacy.sample_rate=0.2", "audit=canaries", "seed=12345",
       "checkpoint_every=1"]  # fmt: skip


class RecordingGrid(FakeGrid):
    def __init__(self) -> None:
        super().__init__()
        self.configs: list[dict] = []

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        self.configs.extend(dict(m.content["config"]) for m in messages)
        return super().send_and_receive(messages, timeout)


def test_secure_canaries_are_keyed_by_a_secret_the_clients_do_not_get(tmp_path: Path) -> None:
    strategy = build(*RUN, "privacy.secure_noise=true", checkpoint_dir=tmp_path)
    grid = RecordingGrid()
    strategy.start(grid, ArrayRecord(random_update(SHAPES, 0.1, seed=0)), num_rounds=1)
    key = strategy.auditor.canaries.seed
    sent = [TrainInstructions.from_config(config) for config in grid.configs]
    assert sent and all(ins.data.partition_seed == 12345 for ins in sent)  # the layout's seed goes out
    assert key != 12345  # the canaries' key is not it
    assert all(key not in [v for v in config.values() if isinstance(v, int)] for config in grid.configs)

    resumed = build(*RUN, "privacy.secure_noise=true", checkpoint_dir=tmp_path, resume_from=load_checkpoint(tmp_path))
    resumed.start(RecordingGrid(), ArrayRecord(random_update(SHAPES, 0.1, seed=0)), num_rounds=2)
    assert resumed.auditor.canaries.seed == key  # the same canaries after a resume


def test_a_seeded_simulation_keys_its_canaries_by_the_seed() -> None:
    strategy = build(*RUN)
    strategy.start(FakeGrid(), ArrayRecord(random_update(SHAPES, 0.1, seed=0)), num_rounds=1)
    assert strategy.auditor.canaries.seed == 12345
