"""Carry runs from one machine to another in a few bounded files: a sweep started on one GPU machine is continued
on another later (``resume=auto``: :func:`fl_app.checkpoint.resolve_start`).

``python -m fl_app.run_pack pack <dir> <dest> [--part-mib 16] [--max-parts 8]`` writes the directory ``<dir>`` (a
run, or a sweep of them: every file under it — checkpoints, run.json, metrics, release logs, final models, Hydra's
configs) as one xz-compressed tar stream cut into parts ``<dest>/<dir name>.tar.xz.000``, ``.001``, … of at most
``--part-mib`` MiB each; more than ``--max-parts`` parts is refused (the parts written are removed, the largest files
named), since what carries them back (a lent machine's output folder) takes a bounded number of bounded files.
``--lean`` leaves out the final models and the checkpoints of completed runs: neither continuing a sweep nor its
report reads them, and they are most of its bytes (a model each), where the way in to a machine is tighter still.

``python -m fl_app.run_pack unpack <dest> <target>`` joins the parts found in ``<dest>`` in order and extracts them
under ``<target>``, which then holds ``<dir name>/`` as it was; a ``<target>/<dir name>`` already there is refused
(it may hold runs continued since the parts were made). A missing or damaged part fails the unpacking (xz
checks every block; a stream cut short is an error), and members that would land outside ``<target>`` (absolute
paths, ``..``, links out) are refused (tarfile's ``data`` filter). Nothing about the runs is interpreted here.
"""

from __future__ import annotations

import argparse
import io
import json
import lzma
import sys
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath

MIB = 1 << 20
SUFFIX = ".tar.xz"


class TooManyPartsError(ValueError):
    """The packed runs need more parts than allowed."""


class _PartWriter(io.RawIOBase):
    """A write-only stream cut into files ``<stem>.000``, ``.001``, … of ``part_bytes`` each."""

    def __init__(self, stem: Path, part_bytes: int, max_parts: int) -> None:
        self.stem, self.part_bytes, self.max_parts = stem, part_bytes, max_parts
        self.parts: list[Path] = []
        self._fh: io.BufferedWriter | None = None
        self._room = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        written = 0
        while written < len(view):
            if self._room == 0:
                self._next_part()
            assert self._fh is not None
            chunk = view[written : written + self._room]
            self._fh.write(chunk)
            self._room -= len(chunk)
            written += len(chunk)
        return written

    def _next_part(self) -> None:
        if self._fh is not None:
            self._fh.close()
        if len(self.parts) == self.max_parts:
            raise TooManyPartsError(f"more than {self.max_parts} parts of {self.part_bytes / MIB:g} MiB")
        path = self.stem.with_name(f"{self.stem.name}.{len(self.parts):03d}")
        self.parts.append(path)
        self._fh = path.open("wb")
        self._room = self.part_bytes

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        super().close()


#: What ``lean`` leaves out: each run's final model, and the checkpoint of a run that has completed.
LEAN_LEAVES_OUT = ("final_model.npz", "checkpoint.npz of a completed run")


def _lean_filter(source: Path) -> Callable[[tarfile.TarInfo], tarfile.TarInfo | None]:
    completed = set()
    for run_json in source.rglob("run.json"):
        try:
            if json.loads(run_json.read_text()).get("status") == "completed":
                completed.add(run_json.parent.relative_to(source.parent).as_posix())
        except (OSError, ValueError):
            continue

    def keep(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
        path = PurePosixPath(member.name)
        if path.name == "final_model.npz" or (path.name == "checkpoint.npz" and str(path.parent) in completed):
            return None
        return member

    return keep


def pack(source: Path, dest: Path, part_mib: float = 16, max_parts: int = 8, lean: bool = False) -> list[Path]:
    """``source`` (a directory) into at most ``max_parts`` parts of ``part_mib`` MiB in ``dest``; the parts.
    ``lean``: without :data:`LEAN_LEAVES_OUT` — what continuing the runs (``resume=auto``) and reporting them do
    not read, the bulk of a sweep's bytes — for carrying a sweep *to* a machine whose inputs are bounded."""
    source = source.resolve()
    if not source.is_dir():
        raise NotADirectoryError(f"{source} is not a directory")
    dest.mkdir(parents=True, exist_ok=True)
    stem = dest / f"{source.name}{SUFFIX}"
    if _parts(stem):
        raise FileExistsError(f"{dest} already holds parts of {stem.name}")
    writer = _PartWriter(stem, int(part_mib * MIB), max_parts)
    try:
        # xz's fastest preset: model weights barely compress at any preset (~0.92), and each block is checked.
        with lzma.LZMAFile(writer, "w", preset=0) as xz, tarfile.open(fileobj=xz, mode="w|") as tar:
            tar.add(source, arcname=source.name, filter=_lean_filter(source) if lean else None)
    except TooManyPartsError as exc:
        writer.close()
        for part in writer.parts:
            part.unlink(missing_ok=True)
        largest = sorted((p for p in source.rglob("*") if p.is_file()), key=lambda p: -p.stat().st_size)[:5]
        sizes = ", ".join(f"{p.relative_to(source)} ({p.stat().st_size / MIB:.1f} MiB)" for p in largest)
        raise TooManyPartsError(
            f"{source} does not fit: {exc} (largest files: {sizes}); --lean leaves out final models and completed "
            "runs' checkpoints, --part-mib and --max-parts set the bounds"
        ) from None
    writer.close()
    return writer.parts


def _parts(stem: Path) -> list[Path]:
    return sorted(stem.parent.glob(f"{stem.name}.[0-9][0-9][0-9]"))


class _JoinedReader(io.RawIOBase):
    """The parts read one after another as one stream."""

    def __init__(self, parts: list[Path]) -> None:
        self._files: Iterator[Path] = iter(parts)
        self._fh: io.BufferedReader | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        while True:
            if self._fh is None:
                path = next(self._files, None)
                if path is None:
                    return 0
                self._fh = path.open("rb")
            n = self._fh.readinto(buffer)
            if n:
                return n
            self._fh.close()
            self._fh = None


def unpack(dest: Path, target: Path) -> list[Path]:
    """Extract every packed directory whose parts are in ``dest`` under ``target``; the directories extracted."""
    stems = sorted({part.with_suffix("") for part in dest.glob(f"*{SUFFIX}.[0-9][0-9][0-9]")})
    if not stems:
        raise FileNotFoundError(f"no parts (*{SUFFIX}.000, …) in {dest}")
    target.mkdir(parents=True, exist_ok=True)
    out = []
    for stem in stems:
        directory = target / stem.name[: -len(SUFFIX)]
        if directory.exists():
            # Never over what is there: it may be newer than the parts (a run continued since they were made).
            raise FileExistsError(f"{directory} already exists: unpack into another folder, or move it away first")
    for stem in stems:
        parts = _parts(stem)
        expected = [stem.with_name(f"{stem.name}.{i:03d}") for i in range(len(parts))]
        if parts != expected:
            raise FileNotFoundError(f"the parts of {stem.name} are not numbered 000..{len(parts) - 1:03d}: {parts}")
        with lzma.LZMAFile(_JoinedReader(parts)) as xz, tarfile.open(fileobj=xz, mode="r|") as tar:
            tar.extractall(target, filter="data")
        out.append(target / stem.name[: -len(SUFFIX)])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="a run or sweep directory into bounded parts")
    p.add_argument("source", type=Path)
    p.add_argument("dest", type=Path)
    p.add_argument("--part-mib", type=float, default=16)
    p.add_argument("--max-parts", type=int, default=8)
    p.add_argument("--lean", action="store_true", help=f"leave out {' and '.join(LEAN_LEAVES_OUT)}")
    u = sub.add_parser("unpack", help="the parts in a directory back into directories")
    u.add_argument("dest", type=Path)
    u.add_argument("target", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "pack":
            for part in pack(args.source, args.dest, args.part_mib, args.max_parts, args.lean):
                print(f"{part} ({part.stat().st_size / MIB:.2f} MiB)")
        else:
            for directory in unpack(args.dest, args.target):
                print(directory)
    except (OSError, ValueError, tarfile.TarError, EOFError, lzma.LZMAError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
