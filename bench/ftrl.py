"""FTRL section of the benchmark: the cost of the four arms of conf/experiment/dp_ftrl.yaml on the CPU
scale (``+scale=cpu privacy.target_epsilon=4``, one Hydra run each, evaluation only after the last round).

Per arm: s/round (median over rounds 3..T−1, the interval between consecutive rounds' records, as P2 measures the
app) and its ratio to dp_fedavg's in the same invocation; peak RSS summed over every process of the run and, at that
peak, per kind of process (as P3 / PEER); and the driver's own peak RSS — the kernel's high-water mark (``VmHWM``)
of the Hydra process, where the ServerApp and so the correlated-noise mechanism run (``run_simulation`` is
in-process). The BLT keeps ``buffers`` model-sized float64 vectors on the server; the driver's peak of
dp_ftrl_fedavg less that of dp_fedavg_unamplified (identity factorization: no buffers, otherwise the same code path)
is set against that size, and the driver peaks of the two arms with no buffers (dp_fedavg and dp_fedavg_unamplified)
say how far apart runs are without it.
"""

from __future__ import annotations

import statistics
import subprocess
import threading
from pathlib import Path
from typing import Any

import numpy as np

from bench.processes import ROOT, THREAD_ENV, PeakRSSMonitor, kill_processes_mentioning, run_env
from bench.run import _app_round_seconds, _hydra_cmd, _num, with_overrides
from fl_app.metrics import read_metrics

FTRL_STRATEGIES = ("dp_fedavg", "dp_fedavg_unamplified", "dp_ftrl_fedavg", "dp_ftrl_fedsam")
FTRL_BASE = ["+scale=cpu", "privacy.target_epsilon=4"]
FTRL_BASELINE = "dp_fedavg"
#: conf/strategy/dp_ftrl_fedavg.yaml's BLT buffers (model-sized float64 vectors kept by the server).
FTRL_BUFFERS = 3


def ftrl_overrides(strategy: str, num_rounds: int, passthrough: list[str] | tuple[str, ...] = ()) -> list[str]:
    """One arm's Hydra overrides: the CPU scale at ε = 4, ``num_rounds`` rounds, evaluation only after the last."""
    base = [*FTRL_BASE, f"strategy={strategy}"]
    return with_overrides(with_overrides(base, f"num_rounds={num_rounds}", f"eval_every={num_rounds}"), *passthrough)


def ratios_to(round_s: dict[str, float | None], baseline: str = FTRL_BASELINE) -> dict[str, float | None]:
    """Each arm's s/round over the baseline's (None where either is missing)."""
    base = round_s.get(baseline)
    return {k: (None if v is None or not base else v / base) for k, v in round_s.items()}


def buffer_resolution(driver_mib: dict[str, float | None], expected_mib: float) -> dict[str, Any]:
    """Can the driver's peak RSS resolve the BLT's buffers? ``delta``: dp_ftrl_fedavg − dp_fedavg_unamplified (same
    code path, BLT vs identity); ``spread``: |dp_fedavg − dp_fedavg_unamplified| (two arms without buffers: how far
    apart runs are without them). Resolved when the spread is under half the expected size and the delta within
    half of it of the expected."""
    ftrl, ident, plain = (driver_mib.get(k) for k in ("dp_ftrl_fedavg", "dp_fedavg_unamplified", "dp_fedavg"))
    delta = None if ftrl is None or ident is None else ftrl - ident
    spread = None if ident is None or plain is None else abs(plain - ident)
    resolved = None
    if delta is not None and spread is not None:
        resolved = spread < expected_mib / 2 and abs(delta - expected_mib) < expected_mib / 2
    return {"expected_mib": expected_mib, "delta_mib": delta, "spread_without_buffers_mib": spread,
            "resolved": resolved}  # fmt: skip


class _HighWaterMark:
    """Polls ``/proc/<pid>/status``'s VmHWM (the kernel's own peak RSS of that process, not a sample) until stopped;
    ``mib`` is the last value read (it only grows)."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.pid, self.interval, self.mib = pid, interval, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        status = Path(f"/proc/{self.pid}/status")
        while not self._stop.is_set():
            try:
                for line in status.read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        self.mib = max(self.mib, int(line.split()[1]) / 1024)
            except (OSError, ValueError):
                pass
            self._stop.wait(self.interval)

    def __enter__(self) -> _HighWaterMark:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def ftrl_run(strategy: str, num_rounds: int, tmp: Path, passthrough: list[str]) -> dict[str, Any]:
    """One arm: a Hydra run with every process pinned (THREAD_ENV), monitored as P3 monitors its runs."""
    out = tmp / f"ftrl_{strategy}"
    env = {**run_env(tmp / f"env_ftrl_{strategy}"), **THREAD_ENV}
    log = tmp / f"ftrl_{strategy}.log"
    cmd = _hydra_cmd(ftrl_overrides(strategy, num_rounds, passthrough), out)
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            with PeakRSSMonitor(proc.pid, marker=env["RAY_TMPDIR"]) as monitor, _HighWaterMark(proc.pid) as hwm:
                proc.wait(timeout=1800)
        finally:
            if proc.poll() is None:
                proc.kill()
            kill_processes_mentioning(env["RAY_TMPDIR"])
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-1500:]
        raise RuntimeError(f"FTRL {strategy} run failed ({proc.returncode}); see {log}:\n{tail}")
    records = read_metrics(out / "metrics.jsonl")
    rounds = _app_round_seconds(records)
    with np.load(out / "final_model.npz") as saved:
        params = int(sum(saved[key].size for key in saved.files))
    return {
        "round_s": statistics.median(rounds),
        "round_s_each": rounds,
        "clients_per_round": statistics.mean(r["aggregated"] for r in records[2 : num_rounds - 1]),
        "peak_rss_mib": monitor.peak / 2**20,
        "peak_rss_by_kind_mib": monitor.peak_by_kind,
        "driver_peak_rss_mib": hwm.mib or None,
        "params": params,
    }


def ftrl_cost(passthrough: list[str], num_rounds: int, tmp: Path) -> dict[str, Any]:
    """The four arms one after the other, then ratios to dp_fedavg and the buffer check."""
    from bench.run import _attempt

    errors: dict[str, str] = {}
    result: dict[str, Any] = {
        "overrides": ftrl_overrides("<arm>", num_rounds, passthrough),
        "thread_env": THREAD_ENV,
        "rounds_measured": f"3..{num_rounds - 1}",
        "statistic": "median",
    }
    runs = {s: _attempt(s, errors, ftrl_run, s, num_rounds, tmp, passthrough) for s in FTRL_STRATEGIES}
    ratios = ratios_to({s: (r or {}).get("round_s") for s, r in runs.items()})
    for strategy, run in runs.items():
        if run:
            run["ratio_to_dp_fedavg"] = ratios[strategy]
    result["arms"] = runs
    params = next((r["params"] for r in runs.values() if r), None)
    if params:
        expected = params * 8 * FTRL_BUFFERS / 2**20
        result["buffers"] = buffer_resolution({s: (r or {}).get("driver_peak_rss_mib") for s, r in runs.items()},
                                              expected)  # fmt: skip
        result["buffers"]["params"] = params
    if errors:
        result["errors"] = errors
    return result


def ftrl_rows(ftrl: dict[str, Any]) -> list[str]:
    """The FTRL block of results.md."""
    lines = [f"| FTRL config (each arm) | `{' '.join(ftrl['overrides'])}` | | |"]
    for strategy, run in ftrl.get("arms", {}).items():
        if not run:
            lines.append(f"| FTRL {strategy} | failed | | |")
            continue
        kinds = ", ".join(f"{k} {v:.0f}" for k, v in sorted(run["peak_rss_by_kind_mib"].items(), key=lambda kv: -kv[1]))
        lines.append(
            f"| FTRL {strategy}: s/round (median, rounds {ftrl['rounds_measured']}); / dp_fedavg; peak RSS all "
            f"processes (MiB) [by kind]; driver (server) peak RSS (MiB) | {run['round_s']:.2f}; "
            f"**{_num(run['ratio_to_dp_fedavg'], '.3f')}**; {run['peak_rss_mib']:.0f} [{kinds}]; "
            f"{_num(run['driver_peak_rss_mib'], '.0f')} | | |"
        )
    if b := ftrl.get("buffers"):
        verdict = {True: "yes", False: "no", None: "n/a"}[b["resolved"]]
        lines.append(
            f"| FTRL server's BLT buffers ({FTRL_BUFFERS} × {b['params']:,} float64 = {b['expected_mib']:.1f} MiB): "
            f"driver peak dp_ftrl_fedavg − dp_fedavg_unamplified (MiB); spread of runs without buffers, "
            f"abs(dp_fedavg − dp_fedavg_unamplified) | {_num(b['delta_mib'], '.1f')}; "
            f"{_num(b['spread_without_buffers_mib'], '.1f')} | resolved | {verdict} |"
        )
    for key, message in ftrl.get("errors", {}).items():
        lines.append(f"| FTRL {key} FAILED | {message.splitlines()[0][:200]} | | |")
    return lines
