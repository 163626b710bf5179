"""``python -m fl_app.audit <run dir>``: recompute a run's canary audit from its ``audit.npz`` and plot it.

Prints the accountant's ε, Andrew et al.'s estimates (final model; all iterates) with their bootstrap intervals and
Steinke et al.'s lower bound, and writes ``audit.png`` (inserted vs null statistic distributions) into the run
directory. The numbers are those the run wrote into ``run.json`` (same statistics, same bootstrap stream, the run's
``audit.guess_rule``; audit files written before the rule existed were two-sided); ``--guess-rule`` recomputes the
bound with the other rule. Exit code: 0, 1 on a PRIVACY VIOLATION (the lower bound), 3 on a PRIVACY ALARM (an
estimate), 2 without an audit file.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from fl_app.audit.canaries import AUDIT_FILE, AuditResult, evaluate_statistics
from fl_app.core.choices import GUESS_RULES, GuessRule
from fl_app.privacy import audit as stats


def load(run_dir: Path, guess_rule: GuessRule | None = None) -> tuple[AuditResult, dict[str, np.ndarray]]:
    """The audit of ``run_dir`` recomputed from its ``audit.npz`` (and the raw arrays), with the lower bound's
    ``guess_rule`` (None: the run's)."""
    path = run_dir / AUDIT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: the run had no canaries (audit.canaries=0) or did not finish")
    with np.load(path) as data:
        arrays = {key: data[key] for key in data.files}
    result = evaluate_statistics(
        arrays["dots"],
        arrays["delta_norms"],
        float(arrays["final_delta_norm"]),
        arrays["inserted"].astype(bool),
        int(arrays["size"]),
        float(arrays["delta"]),
        float(arrays["bound_delta"]),
        float(arrays["confidence"]),
        int(arrays["seed"]),
        int(arrays["round"]),
        _none_if_nan(float(arrays["accountant_epsilon"])),
        _none_if_nan(float(arrays["accountant_epsilon_at_bound_delta"])),
        # Older audit files have dense canaries only.
        int(arrays["support"]) or None if "support" in arrays else None,
        # Older audit files guessed two-sided (the only rule before audit.guess_rule).
        guess_rule or (str(arrays["guess_rule"]) if "guess_rule" in arrays else "two_sided"),  # type: ignore[arg-type]
    )
    return result, arrays


def _none_if_nan(value: float) -> float | None:
    return None if math.isnan(value) else value


def plot(result: AuditResult, arrays: dict[str, np.ndarray], path: Path) -> Path:
    """Histograms of the inserted and the null canaries' statistics, one panel per threat model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    inserted = arrays["inserted"].astype(bool)
    panels = [
        ("final model", stats.final_model_statistics(arrays["dots"], float(arrays["final_delta_norm"])),
         result.estimate_final),
        ("all iterates", stats.all_iterates_statistics(arrays["dots"], arrays["delta_norms"]),
         result.estimate_iterates),
    ]  # fmt: skip
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    accountant = "n/a" if result.accountant_epsilon is None else f"{result.accountant_epsilon:.3g}"
    for ax, (name, values, estimate) in zip(axes, panels, strict=True):
        bins = np.histogram_bin_edges(values, bins=40)
        ax.hist(values[~inserted], bins=bins, alpha=0.6, label=f"null ({int((~inserted).sum())})")
        ax.hist(values[inserted], bins=bins, alpha=0.6, label=f"inserted ({int(inserted.sum())})")
        ax.set_title(
            f"{name}: estimate ε = {estimate.epsilon:.3g} [{estimate.low:.3g}, {estimate.high:.3g}]", fontsize=10
        )
        ax.set_xlabel("canary statistic")
        ax.legend(fontsize=8)
    verdict = "  — VIOLATION" if result.violation else "  — ALARM" if result.alarm else ""
    fig.suptitle(
        f"canary audit after round {result.round}: accountant ε = {accountant}, "
        f"one-run lower bound ε ≥ {result.lower_bound.epsilon:.3g}{verdict}",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def summary(result: AuditResult) -> dict[str, Any]:
    return {"round": result.round, "accountant_epsilon": result.accountant_epsilon, **result.record()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fl_app.audit", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--png", type=Path, default=None, help="where to write the plot (default: <run dir>/audit.png)")
    parser.add_argument("--guess-rule", choices=GUESS_RULES, default=None,
                        help="the lower bound's guesses (default: the run's audit.guess_rule)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        result, arrays = load(args.run_dir, args.guess_rule)
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(json.dumps(summary(result), indent=2))
    png = plot(result, arrays, args.png or args.run_dir / "audit.png")
    print(f"wrote {png}")
    return 1 if result.violation else 3 if result.alarm else 0


if __name__ == "__main__":
    raise SystemExit(main())
