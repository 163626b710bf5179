"""Hydra entry point: ``python -m fl_app.main [overrides]`` and ``--multirun`` sweeps.

The config is composed by Hydra and validated (:func:`fl_app.config.load_app_config`) and the dataset is checked
*before* Ray starts; then the same ServerApp/ClientApp as ``flwr run`` runs on Flower's simulation engine.
Each run writes its resolved config (Hydra's ``.hydra/``), ``run.json``, ``metrics.jsonl`` and
``final_model.npz`` into its own output directory.

Flower 1.41 marks ``flwr.simulation.run_simulation`` deprecated in favour of ``flwr run``. We keep it here
because a Hydra job (one of many in a sweep) needs an in-process launch with its own config object and output
directory; the ServerApp/ClientApp it runs are exactly the ones ``flwr run`` uses (see README).
"""

from __future__ import annotations

import logging
import math
import os
import sys
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from fl_app.checkpoint import resolve_resume
from fl_app.config import AppConfig, ConfigError, load_app_config
from fl_app.data.datasets import DatasetUnavailableError, load_dataset


def simulation_nodes(config: AppConfig) -> int:
    """SuperNodes to simulate: M with population=nodes; otherwise one per concurrent worker (results do not
    depend on it, see strategies.population)."""
    if config.population == "nodes":
        return config.dataset.num_clients
    workers = max(1, int(_total_cpus(config) // max(config.simulation.client_cpus, 1e-9)))
    return max(1, min(config.dataset.num_clients, workers))


def _total_cpus(config: AppConfig) -> int:
    return config.simulation.total_cpus or os.cpu_count() or 1


def backend_config(config: AppConfig) -> dict:
    sim = config.simulation
    init_args: dict = {"logging_level": "ERROR", "log_to_driver": True}
    if sim.total_cpus is not None:
        init_args["num_cpus"] = sim.total_cpus
    return {"client_resources": {"num_cpus": sim.client_cpus, "num_gpus": sim.client_gpus}, "init_args": init_args}


def preflight(config: AppConfig) -> None:
    """Checks that must fail before Ray starts: noise calibration and the accountant are set up (an unreachable
    target epsilon raises ValueError), and missing data raises DatasetUnavailableError with the how-to message."""
    from fl_app.server_app import build_strategy

    build_strategy(config)
    load_dataset(config.dataset.name, config.dataset.data_dir, download=config.dataset.download)


def run(config: AppConfig, output_dir: Path, progress: bool | None = None) -> None:
    """Run one simulation of ``config`` (validated, and :func:`preflight`-checked) writing into ``output_dir``."""
    from flwr.simulation import run_simulation

    from fl_app.client_app import app as client_app
    from fl_app.server_app import make_server_app

    # The server's own torch work (evaluation) stays within the simulation's CPU share.
    torch.set_num_threads(_total_cpus(config))
    # Hydra's root handler would print every Flower log line a second time.
    logging.getLogger("flwr").propagate = False
    # Flower logs a deprecation warning for run_simulation here; see the module docstring and README.
    run_simulation(
        server_app=make_server_app(config, output_dir, progress=progress),
        client_app=client_app,
        num_supernodes=simulation_nodes(config),
        backend_config=backend_config(config),
    )
    if not (output_dir / "final_model.npz").exists():
        raise RuntimeError(f"the simulation did not complete; see the log above and {output_dir}/run.json")


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    try:
        config = resolve_resume(load_app_config(cfg))
        preflight(config)
    except (ConfigError, DatasetUnavailableError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    output_dir = Path(config.output_dir or HydraConfig.get().runtime.output_dir)
    run(config, output_dir)
    from fl_app.metrics import read_metrics

    records = read_metrics(output_dir / "metrics.jsonl")
    accs = [r["test_accuracy"] for r in records if r.get("test_accuracy") is not None]
    return float(accs[-1]) if accs else math.nan


if __name__ == "__main__":
    main()
