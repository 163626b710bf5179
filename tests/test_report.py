"""The sweep report: papers' table layout, failed and missing jobs never dropped, CSVs, plots and CLI."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fl_app.report import (
    build_report,
    canon,
    collect_runs,
    detect_column_keys,
    expected_jobs,
    format_cell,
    main,
    missing_jobs,
)

# (strategy, seed, alpha) -> (best test acc, final test acc, final train acc, final epsilon)
RESULTS = {
    ("dp_fedavg", 0, 0.3): (0.80, 0.78, 0.90, 2.0),
    ("dp_fedavg", 1, 0.3): (0.90, 0.86, 0.94, 2.0),
    ("dp_fedavg", 0, 0.6): (0.70, 0.70, 0.75, 2.0),
    ("dp_fedavg", 1, 0.6): (0.72, 0.71, 0.77, 2.0),
    ("dp_fedsam", 0, 0.3): (0.85, 0.84, 0.88, 2.0),
    ("dp_fedsam", 0, 0.6): (0.60, 0.60, 0.60, 1.0),  # this job fails after 2 rounds
    ("dp_fedsam", 1, 0.6): (0.75, 0.74, 0.79, 2.0),
    # ("dp_fedsam", 1, 0.3) is missing: no job directory at all
}
FAILED = ("dp_fedsam", 0, 0.6)


def _records(best: float, final: float, train: float, eps: float, rounds: int = 3) -> list[dict[str, Any]]:
    tests = [best - 0.1, best, final][:rounds]
    trains = [train - 0.2, train - 0.1, train][:rounds]
    return [
        {
            "round": t + 1,
            "test_accuracy": tests[t],
            "test_loss": 1.0 - tests[t],
            "train_accuracy": trains[t],
            "epsilon": eps * (t + 1) / 3,
            "delta": 1e-3,
            "norm_mean": 1.0 + t,
            "client_norms": [0.5 + t, 1.0 + t, 1.5 + t],
        }
        for t in range(rounds)
    ]


def _job(
    sweep: Path,
    num: int,
    overrides: list[str],
    config: dict[str, Any],
    status: str,
    records: list[dict[str, Any]],
    error: str | None = None,
) -> Path:
    d = sweep / str(num)
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    meta: dict[str, Any] = {"status": status, "config": config, "dp_guarantee": "client-level"}
    if error:
        meta["error"] = error
    if records:
        meta["epsilon"] = records[-1]["epsilon"]
    (d / "run.json").write_text(json.dumps(meta))
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return d


def _config(strategy: str, seed: int, alpha: float, **privacy: Any) -> dict[str, Any]:
    return {
        "seed": seed,
        "strategy": {"name": strategy, "target": f"strategies.{strategy}.X", "sparsity": 0.4},
        "dataset": {"name": "fashion_mnist", "alpha": alpha, "partition": "dirichlet"},
        "privacy": {"target_epsilon": 2.0, **privacy},
    }


def _multirun(sweep: Path, task: list[str]) -> None:
    sweep.mkdir(parents=True, exist_ok=True)
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": {"task": task}}}))


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    root = tmp_path / "sweep"
    _multirun(root, ["strategy=dp_fedavg,dp_fedsam", "seed=0,1", "dataset.alpha=0.3,0.6"])
    num = 0
    for strategy in ("dp_fedavg", "dp_fedsam"):
        for seed in (0, 1):
            for alpha in (0.3, 0.6):
                key = (strategy, seed, alpha)
                overrides = [f"strategy={strategy}", f"seed={seed}", f"dataset.alpha={alpha}"]
                if key == FAILED:
                    recs = _records(*RESULTS[key], rounds=2)
                    _job(root, num, overrides, _config(*key), "failed", recs, error="RuntimeError: boom")
                elif key in RESULTS:
                    _job(root, num, overrides, _config(*key), "completed", _records(*RESULTS[key]))
                num += 1
    return root


def _row(markdown: str, name: str) -> str:
    return next(line for line in markdown.splitlines() if line.startswith(f"| {name} |"))


def test_collect_and_expected(sweep: Path) -> None:
    runs = collect_runs(sweep)
    assert len(runs) == 7
    assert [r.status for r in runs].count("failed") == 1
    expected = expected_jobs(sweep)
    assert len(expected) == 8
    assert expected[6].overrides == {"strategy": "dp_fedsam", "seed": 1, "dataset.alpha": 0.3}
    missing = missing_jobs(expected, runs)
    assert [j.index for j in missing] == [6]
    assert detect_column_keys(runs, expected, "strategy") == ["dataset.alpha"]
    fedavg = next(r for r in runs if r.path.name == "0")
    assert fedavg.best_test_accuracy == pytest.approx(0.80)
    assert fedavg.final_test_accuracy == pytest.approx(0.78)
    assert fedavg.gap == pytest.approx(0.12)
    assert fedavg.epsilon == pytest.approx(2.0)


def test_canon_equates_config_and_override_text() -> None:
    assert canon(0.3) == canon("0.3") == "0.3"
    assert canon(1.0) == canon(1) == canon("1") == "1"
    assert canon(None) == "null" and canon(True) == "true" and canon("dp_fedsam") == "dp_fedsam"


def test_report_table_csv_and_plots(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = sweep / "report"
    assert main([str(sweep), "--title", "Fashion-MNIST"]) == 0
    printed = capsys.readouterr().out
    md = (out / "table.md").read_text()
    assert printed == md
    assert md.startswith("# Fashion-MNIST\n")
    header = md.splitlines()[4]
    assert header == (
        "| strategy | alpha=0.3 best | alpha=0.3 final | alpha=0.3 train | alpha=0.3 gap | alpha=0.3 ε "
        "| alpha=0.6 best | alpha=0.6 final | alpha=0.6 train | alpha=0.6 gap | alpha=0.6 ε |"
    )
    # dp_fedavg, alpha=0.3: best 0.80/0.90, final 0.78/0.86, train 0.90/0.94, gap 0.12/0.08 (sample std).
    fedavg = _row(md, "dp_fedavg")
    assert fedavg.startswith("| dp_fedavg | 85.00 ± 7.07 | 82.00 ± 5.66 | 92.00 ± 2.83 | 10.00 ± 2.83 | 2.00 |")
    assert fedavg.endswith("| 71.00 ± 1.41 | 70.50 ± 0.71 | 76.00 ± 1.41 | 5.50 ± 0.71 | 2.00 |")
    # dp_fedsam: alpha=0.3 has seed 1 missing, alpha=0.6 has seed 0 failed: means over the completed seed.
    fedsam = _row(md, "dp_fedsam")
    assert fedsam == (
        "| dp_fedsam | 85.00 (1/2 seeds) | 84.00 (1/2 seeds) | 88.00 (1/2 seeds) | 4.00 (1/2 seeds) "
        "| 2.00 (1/2 seeds) | 75.00 (1/2 seeds) | 74.00 (1/2 seeds) | 79.00 (1/2 seeds) | 5.00 (1/2 seeds) "
        "| 2.00 (1/2 seeds) |"
    )
    assert "6 completed run(s), 1 failed/incomplete, 1 missing." in md
    assert "- **MISSING** strategy=dp_fedsam, seed=1, dataset.alpha=0.3: job 6 of sweep `.` has no job directory" in md
    assert (
        "- **FAILED** `5` (strategy=dp_fedsam, dataset.alpha=0.6, seed=0): status failed after 2 round(s): "
        "RuntimeError: boom" in md
    )

    with (out / "table.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == 4 * 5  # 4 cells x 5 metrics
    best = next(
        r
        for r in table
        if (r["strategy"], r["dataset.alpha"], r["metric"]) == ("dp_fedavg", "0.3", "best_test_accuracy")
    )
    assert float(best["mean"]) == pytest.approx(85.0) and float(best["std"]) == pytest.approx(7.0710678, abs=1e-6)
    assert (best["n_completed"], best["n_expected"], best["cell"]) == ("2", "2", "85.00 ± 7.07")
    partial = next(r for r in table if (r["strategy"], r["dataset.alpha"], r["metric"]) == ("dp_fedsam", "0.3", "gap"))
    assert (partial["n_completed"], partial["n_expected"], partial["n_missing"], partial["std"]) == ("1", "2", "1", "")

    with (out / "runs.csv").open() as fh:
        runs = list(csv.DictReader(fh))
    assert len(runs) == 8
    by_status: dict[str, list[dict[str, str]]] = {}
    for r in runs:
        by_status.setdefault(r["status"], []).append(r)
    assert len(by_status["completed"]) == 6
    (failed,) = by_status["failed"]
    assert (failed["path"], failed["rounds"], failed["error"]) == ("5", "2", "RuntimeError: boom")
    (missing,) = by_status["missing"]
    assert (missing["strategy"], missing["seed"], missing["dataset.alpha"], missing["rounds"]) == (
        "dp_fedsam",
        "1",
        "0.3",
        "0",
    )
    first = next(r for r in runs if r["path"] == "0")
    assert float(first["best_test_accuracy"]) == pytest.approx(0.80) and float(first["gap"]) == pytest.approx(0.12)

    with (out / "rounds.csv").open() as fh:
        rounds = list(csv.DictReader(fh))
    # Completed runs only, one row per recorded round, metrics.jsonl's units.
    assert {r["path"] for r in rounds} == {r["path"] for r in by_status["completed"]}
    first_rounds = [r for r in rounds if r["path"] == "0"]
    assert [int(r["round"]) for r in first_rounds] == list(range(1, len(first_rounds) + 1))
    assert max(float(r["test_accuracy"]) for r in first_rounds if r["test_accuracy"]) == pytest.approx(0.80)

    for name in ("accuracy_vs_round.png", "epsilon_vs_round.png", "norm_histogram.png", "ablation.png"):
        assert (out / name).stat().st_size > 1000, name
    assert not (out / "clip_norm_vs_round.png").exists()  # no run recorded C


def test_all_failed_and_all_missing_cells(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "sweep"
    _multirun(root, ["strategy=dp_fedavg,dp_fedsam,fedavg", "seed=0", "num_rounds=3"])
    _job(root, 0, ["strategy=dp_fedavg", "seed=0", "num_rounds=3"], _config("dp_fedavg", 0, 0.3), "failed", [], "X")
    partial = _records(0.5, 0.5, 0.5, 1.0, rounds=1)
    _job(root, 2, ["strategy=fedavg", "seed=0", "num_rounds=3"], _config("fedavg", 0, 0.3), "running", partial)
    out = tmp_path / "out"
    assert main([str(root), "--out", str(out)]) == 0
    md = capsys.readouterr().out
    assert (
        _row(md, "dp_fedavg")
        == "| dp_fedavg | failed (1/1) | failed (1/1) | failed (1/1) | failed (1/1) | failed (1/1) |"
    )
    assert _row(md, "dp_fedsam") == "| dp_fedsam | missing | missing | missing | missing | missing |"
    assert _row(md, "fedavg").startswith("| fedavg | failed (1/1) |")
    assert "**MISSING** strategy=dp_fedsam, seed=0, num_rounds=3: job 1" in md
    assert "**INCOMPLETE** `2` (strategy=fedavg, seed=0): status running after 1 round(s)" in md
    assert "| strategy | best | final | train | gap | ε |" in md
    assert not (out / "ablation.png").exists()
    assert (out / "accuracy_vs_round.png").stat().st_size > 0


def test_single_numeric_column_gives_ablation_plot(tmp_path: Path) -> None:
    root = tmp_path / "sweep"
    _multirun(root, ["strategy=dp_fedavg,dp_fedsam", "seed=0,1", "privacy.target_epsilon=1,2,4"])
    num = 0
    for strategy in ("dp_fedavg", "dp_fedsam"):
        for seed in (0, 1):
            for eps in (1, 2, 4):
                overrides = [f"strategy={strategy}", f"seed={seed}", f"privacy.target_epsilon={eps}"]
                config = _config(strategy, seed, 0.6, target_epsilon=float(eps))
                acc = 0.5 + 0.05 * eps + 0.01 * seed
                _job(root, num, overrides, config, "completed", _records(acc, acc, acc + 0.1, float(eps)))
                num += 1
    report = build_report(root)
    assert report.col_keys == ["privacy.target_epsilon"]
    assert report.combos == [("1",), ("2",), ("4",)]
    assert format_cell(report.cell("dp_fedsam", ("4",)), "best_test_accuracy") == "70.50 ± 0.71"
    assert format_cell(report.cell("dp_fedsam", ("4",)), "epsilon") == "4.00"
    out = tmp_path / "out"
    assert main([str(root), "--out", str(out), "--cols", "privacy.target_epsilon"]) == 0
    assert (out / "ablation.png").stat().st_size > 1000
    # Columns chosen by hand: the same sweep with rows = epsilon and no columns.
    assert main([str(root), "--out", str(tmp_path / "out2"), "--rows", "privacy.target_epsilon", "--cols"]) == 0
    md = (tmp_path / "out2" / "table.md").read_text()
    assert _row(md, "4").startswith("| 4 | 70.50 ± 0.58 |")  # 4 runs: 0.70, 0.71 per strategy


def test_runs_without_hydra_dirs_use_config_differences(tmp_path: Path) -> None:
    for i, (strategy, alpha) in enumerate([("dp_fedavg", 0.3), ("dp_fedavg", 0.6), ("dp_fedsam", 0.3)]):
        d = tmp_path / f"run{i}"
        d.mkdir()
        (d / "run.json").write_text(json.dumps({"status": "completed", "config": _config(strategy, 0, alpha)}))
        (d / "metrics.jsonl").write_text(json.dumps(_records(0.8, 0.8, 0.9, 1.0)[0]) + "\n")
    runs = collect_runs(tmp_path)
    assert detect_column_keys(runs, [], "strategy") == ["dataset.alpha"]


def test_no_runs_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path)]) == 1
    assert "no runs" in capsys.readouterr().err
    _multirun(tmp_path / "s", ["seed=0,1"])
    assert main([str(tmp_path / "s")]) == 1
    assert "2 job(s) expected" in capsys.readouterr().err
    assert main([str(tmp_path / "nope")]) == 1


def test_expected_jobs_include_the_presets_sweeper_params_with_command_line_precedence(tmp_path: Path) -> None:
    # An experiment preset puts its sweep in hydra.sweeper.params; the command line's task overrides come after
    # and win for a key given twice (Hydra's BasicSweeper), keeping the key's first position.
    root = tmp_path / "preset"
    root.mkdir()
    hydra_cfg = {
        "sweeper": {"params": {"strategy": "dp_fedavg,dp_fedsam,dp_fedsam_topk", "+split": "dir03,iid", "seed": "0,1"}},
        "overrides": {"task": ["+experiment=table1", "+scale=cpu", "strategy=dp_fedavg,dp_fedsam"]},
    }
    (root / "multirun.yaml").write_text(yaml.safe_dump({"hydra": hydra_cfg}))
    jobs = expected_jobs(root)
    assert len(jobs) == 2 * 2 * 2  # strategy narrowed to 2 by the command line
    assert jobs[0].overrides == {
        "strategy": "dp_fedavg",
        "split": "dir03",
        "seed": 0,
        "experiment": "table1",
        "scale": "cpu",
    }
    assert jobs[-1].overrides["strategy"] == "dp_fedsam" and jobs[-1].overrides["seed"] == 1


def test_audit_columns_come_from_each_runs_audit_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--audit`` adds the canary audit's estimates and lower bound (run.json ``audit``), mean ± std over seeds;
    a run without canaries shows "-"."""
    audits = {0: (1.0, 2.0, 0.5), 1: (3.0, 4.0, 0.7)}
    for seed, (final, iterates, bound) in audits.items():
        _job(tmp_path, seed, ["strategy=dp_fedavg", f"seed={seed}"], _config("dp_fedavg", seed, 0.6), "completed",
             _records(0.8, 0.8, 0.9, 2.0))  # fmt: skip
        meta = json.loads((tmp_path / str(seed) / "run.json").read_text())
        meta["audit"] = {"eps_estimate_final": final, "eps_estimate_iterates": iterates, "eps_lower_bound": bound}
        (tmp_path / str(seed) / "run.json").write_text(json.dumps(meta))
    _job(
        tmp_path, 2, ["strategy=fedavg", "seed=0"], _config("fedavg", 0, 0.6), "completed", _records(0.8, 0.8, 0.9, 2.0)
    )
    assert main([str(tmp_path), "--audit", "--cols"]) == 0
    markdown = capsys.readouterr().out
    assert "ε̂ final | ε̂ iterates | ε lower bound |" in markdown
    assert _row(markdown, "dp_fedavg").endswith("| 2.00 ± 1.41 | 3.00 ± 1.41 | 0.60 ± 0.14 |")
    assert _row(markdown, "fedavg").endswith("| - | - | - |")
    assert main([str(tmp_path), "--cols"]) == 0
    assert "ε̂" not in capsys.readouterr().out


def test_clip_norm_curves_are_plotted_when_runs_record_c(tmp_path: Path) -> None:
    root = tmp_path / "sweep"
    _multirun(root, ["strategy=dp_fedavg", "seed=0,1", "privacy.clipping=fixed,adaptive"])
    num = 0
    for seed in (0, 1):
        for clipping in ("fixed", "adaptive"):
            records = _records(0.5, 0.5, 0.6, 1.0)
            for t, record in enumerate(records):
                record["clip_norm"] = 0.05 if clipping == "fixed" else 0.05 * 1.6**t
            overrides = ["strategy=dp_fedavg", f"seed={seed}", f"privacy.clipping={clipping}"]
            _job(root, num, overrides, _config("dp_fedavg", seed, 0.6), "completed", records)
            num += 1
    out = tmp_path / "out"
    assert main([str(root), "--out", str(out), "--cols", "privacy.clipping"]) == 0
    assert (out / "clip_norm_vs_round.png").stat().st_size > 1000
