"""fl_app/run_pack.py: a directory into bounded parts and back, and every way the parts can be wrong failing loudly.
(A killed sweep carried this way and continued: tests/test_checkpoint.py.)"""

from __future__ import annotations

import io
import lzma
import os
import tarfile
from pathlib import Path

import pytest

from fl_app.run_pack import MIB, TooManyPartsError, main, pack, unpack


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """Two jobs: incompressible bytes (like model weights) and text, ~0.6 MiB in all."""
    root = tmp_path / "sweep"
    for job in ("0", "1"):
        (root / job / ".hydra").mkdir(parents=True)
        (root / job / "checkpoint.npz").write_bytes(os.urandom(300_000))
        (root / job / "metrics.jsonl").write_text('{"round": 1}\n' * 100)
        (root / job / ".hydra" / "config.yaml").write_text(f"seed: {job}\n")
    return root


def test_pack_and_unpack_give_the_directory_back_in_bounded_parts(sweep: Path, tmp_path: Path) -> None:
    parts = pack(sweep, tmp_path / "parts", part_mib=0.25, max_parts=8)
    assert [p.name for p in parts] == [f"sweep.tar.xz.{i:03d}" for i in range(len(parts))] and len(parts) == 3
    assert all(p.stat().st_size == 0.25 * MIB for p in parts[:-1]) and parts[-1].stat().st_size <= 0.25 * MIB
    assert unpack(tmp_path / "parts", tmp_path / "b") == [tmp_path / "b" / "sweep"]
    assert _tree(tmp_path / "b" / "sweep") == _tree(sweep)


def test_lean_leaves_out_final_models_and_completed_runs_checkpoints(sweep: Path, tmp_path: Path) -> None:
    (sweep / "0" / "run.json").write_text('{"status": "completed"}')
    (sweep / "1" / "run.json").write_text('{"status": "running"}')
    for job in ("0", "1"):
        (sweep / job / "final_model.npz").write_bytes(b"model")
    pack(sweep, tmp_path / "parts", lean=True)
    unpack(tmp_path / "parts", tmp_path / "b")
    got, full = _tree(tmp_path / "b" / "sweep"), _tree(sweep)
    assert set(full) - set(got) == {"0/final_model.npz", "1/final_model.npz", "0/checkpoint.npz"}
    assert all(got[name] == full[name] for name in got)


def test_unpacking_over_a_directory_already_there_is_refused(sweep: Path, tmp_path: Path) -> None:
    """What is there may be newer than the parts (a run continued since): never overwritten."""
    pack(sweep, tmp_path / "parts")
    unpack(tmp_path / "parts", tmp_path / "b")
    (tmp_path / "b" / "sweep" / "0" / "metrics.jsonl").write_text("newer\n")
    with pytest.raises(FileExistsError, match="already exists"):
        unpack(tmp_path / "parts", tmp_path / "b")
    assert (tmp_path / "b" / "sweep" / "0" / "metrics.jsonl").read_text() == "newer\n"


def test_too_many_parts_is_refused_and_leaves_nothing(sweep: Path, tmp_path: Path) -> None:
    with pytest.raises(TooManyPartsError, match=r"more than 2 parts of 0\.25 MiB .*checkpoint\.npz.*--lean"):
        pack(sweep, tmp_path / "parts", part_mib=0.25, max_parts=2)
    assert list((tmp_path / "parts").iterdir()) == []


def test_packing_twice_into_one_place_is_refused(sweep: Path, tmp_path: Path) -> None:
    pack(sweep, tmp_path / "parts")
    with pytest.raises(FileExistsError, match="already holds parts"):
        pack(sweep, tmp_path / "parts")


@pytest.mark.parametrize("damage", ["missing-last", "missing-middle", "flipped-byte"])
def test_missing_or_damaged_parts_fail_the_unpacking(sweep: Path, tmp_path: Path, damage: str) -> None:
    parts = pack(sweep, tmp_path / "parts", part_mib=0.25)
    if damage == "missing-last":
        parts[-1].unlink()
    elif damage == "missing-middle":
        parts[1].unlink()
    else:
        data = bytearray(parts[1].read_bytes())
        data[1000] ^= 0xFF
        parts[1].write_bytes(bytes(data))
    with pytest.raises((EOFError, lzma.LZMAError, tarfile.TarError, FileNotFoundError)):
        unpack(tmp_path / "parts", tmp_path / "b")


def test_a_member_outside_the_target_is_refused(tmp_path: Path) -> None:
    (tmp_path / "parts").mkdir()
    buffer = io.BytesIO()
    with lzma.LZMAFile(buffer, "w") as xz, tarfile.open(fileobj=xz, mode="w|") as tar:
        info = tarfile.TarInfo("../escaped.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    (tmp_path / "parts" / "evil.tar.xz.000").write_bytes(buffer.getvalue())
    with pytest.raises(tarfile.TarError):
        unpack(tmp_path / "parts", tmp_path / "b")
    assert not (tmp_path / "escaped.txt").exists()


def test_the_command_line_prints_the_parts_and_exits_2_on_error(
    sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["pack", str(sweep), str(tmp_path / "parts"), "--part-mib", "1"]) == 0
    assert "sweep.tar.xz.000" in capsys.readouterr().out
    assert main(["unpack", str(tmp_path / "parts"), str(tmp_path / "b")]) == 0
    assert _tree(tmp_path / "b" / "sweep") == _tree(sweep)
    assert main(["unpack", str(tmp_path / "nothing"), str(tmp_path / "c")]) == 2
    assert "no parts" in capsys.readouterr().err
