"""fl_app/checkpoint.py: how a run starts in a directory — a new run never writes over another, and ``resume=auto``
starts, skips or continues a sweep job — and a killed run carried to another machine (fl_app/run_pack.py) and
continued there ends with the model and ε of a run never interrupted. Runs go through the ServerApp's
run_federated on Flower's in-memory grid (clients answer zero updates: the released models are the noise)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from flwr.superlink.grid import InMemoryGrid

from apps.server_app import run_federated
from fl_app.checkpoint import CHECKPOINT_FILE, held_run, refuse_held_run, resolve_start
from fl_app.config import compose_config
from fl_app.releases import ReleaseLog
from fl_app.run_pack import pack, unpack
from tests.helpers import FakeGrid
from tests.strategies.conftest import task_identity  # noqa: F401  (flwr Messages need a task identity)

RUN = [
    "strategy=dp_fedavg",
    "dataset.num_clients=20",
    "dataset.max_train_samples=400",
    "dataset.max_test_samples=100",
    "privacy.sample_rate=0.25",
    "num_rounds=6",
    "checkpoint_every=2",
]


class SimulationGrid(FakeGrid, InMemoryGrid):
    """Flower's simulation engine as the strategy sees it (seeded randomness), killed (SIGINT) as round
    ``crash_round``'s messages go out."""

    def __init__(self, crash_round: int | None = None) -> None:
        super().__init__()
        self.crash_round = crash_round

    def send_and_receive(self, messages, timeout=None):
        if self._pushes + 1 == self.crash_round:
            raise KeyboardInterrupt("killed")
        return super().send_and_receive(messages, timeout)


def _start(out: Path, *extra: str):
    return resolve_start(compose_config([*RUN, *extra, f"output_dir={out}"]), out.parent / "default")


def _run(out: Path, *extra: str, crash_round: int | None = None) -> None:
    start = _start(out, *extra)
    assert not start.completed
    run_federated(SimulationGrid(crash_round), start.config, start.output_dir, progress=False)


def _killed(out: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        _run(out, crash_round=4)  # rounds 1..3 released, the checkpoint after round 2
    assert json.loads((out / "run.json").read_text())["status"] != "completed"


def test_a_new_run_in_a_directory_that_holds_one_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    out = tmp_path / "job"
    assert held_run(out) is None
    refuse_held_run(out)  # nothing there
    _run(out)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    with pytest.raises(ValueError, match=r"already holds a run \(status completed\): write elsewhere"):
        _run(out)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "metrics.jsonl").write_text("{}\n")  # a run's file alone is enough
    with pytest.raises(ValueError, match=r"status unknown\): continue it with resume="):
        refuse_held_run(tmp_path / "other")


def test_resume_auto_starts_skips_or_continues(tmp_path: Path) -> None:
    fresh = _start(tmp_path / "new", "resume=auto")
    assert fresh.config.resume is None and not fresh.completed and fresh.output_dir == tmp_path / "new"
    _run(tmp_path / "done")
    assert _start(tmp_path / "done", "resume=auto").completed
    _killed(tmp_path / "killed")
    resumed = _start(tmp_path / "killed", "resume=auto")
    assert resumed.config.resume == str((tmp_path / "killed").resolve()) and not resumed.completed


def test_resume_auto_refuses_another_config_and_a_run_without_a_checkpoint(tmp_path: Path) -> None:
    _run(tmp_path / "done")
    with pytest.raises(ValueError, match=r"holds a completed run of another config \(it differs in num_rounds\)"):
        _start(tmp_path / "done", "resume=auto", "num_rounds=8")  # an edited sweep: never its stale results
    (tmp_path / "done" / CHECKPOINT_FILE).unlink()  # a lean pack leaves it out: run.json says what ran
    assert _start(tmp_path / "done", "resume=auto").completed
    _killed(tmp_path / "killed")
    with pytest.raises(ValueError, match=r"another config \(it differs in privacy\.clip_norm, seed\)"):
        _start(tmp_path / "killed", "resume=auto", "seed=7", "privacy.clip_norm=0.5")
    (tmp_path / "killed" / CHECKPOINT_FILE).unlink()
    with pytest.raises(ValueError, match=r"without a checkpoint\.npz: it cannot be continued"):
        _start(tmp_path / "killed", "resume=auto")
    with pytest.raises(FileNotFoundError, match="did you mean resume=auto"):
        _start(tmp_path / "killed", "resume=AUTO")


def test_a_killed_sweep_carried_to_another_machine_ends_as_if_never_interrupted(tmp_path: Path) -> None:
    """Two jobs of a sweep: one completed, one killed in round 4. The sweep directory is packed lean into bounded
    parts, unpacked elsewhere, and run again with resume=auto: the completed job is skipped, the killed one continues
    (a seeded re-run of round 3 repeats its logged release) and ends with the model and ε of an uninterrupted run."""
    sweep = tmp_path / "machine_a" / "sweep"
    _run(sweep / "0", "seed=1")
    _killed(sweep / "1")
    parts = pack(sweep, tmp_path / "carried", part_mib=4, max_parts=8, lean=True)
    assert 1 < len(parts) <= 8 and all(p.stat().st_size <= 4 * 2**20 for p in parts)
    (moved,) = unpack(tmp_path / "carried", tmp_path / "machine_b")
    assert moved == tmp_path / "machine_b" / "sweep"
    # Lean: the completed job without its model and checkpoint (its records are all a report reads).
    assert not (moved / "0" / "final_model.npz").exists() and not (moved / "0" / CHECKPOINT_FILE).exists()
    assert (moved / "0" / "metrics.jsonl").read_bytes() == (sweep / "0" / "metrics.jsonl").read_bytes()
    assert (moved / "1" / CHECKPOINT_FILE).read_bytes() == (sweep / "1" / CHECKPOINT_FILE).read_bytes()

    assert _start(moved / "0", "seed=1", "resume=auto").completed
    _run(moved / "1", "resume=auto")
    _run(tmp_path / "uninterrupted")
    for name in ("final_model.npz",):
        with np.load(moved / "1" / name) as got, np.load(tmp_path / "uninterrupted" / name) as want:
            assert got.files == want.files
            assert all(np.array_equal(got[k], want[k]) for k in got.files)
    meta = json.loads((moved / "1" / "run.json").read_text())
    reference = json.loads((tmp_path / "uninterrupted" / "run.json").read_text())
    assert meta["status"] == "completed" and meta["epsilon"] == reference["epsilon"]
    assert [r.round for r in ReleaseLog(moved / "1").read()] == [1, 2, 3, 3, 4, 5, 6]
