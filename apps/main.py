"""Hydra entry point: ``python -m apps.main [overrides]`` and ``--multirun`` sweeps.

The config is composed by Hydra and validated (:func:`fl_app.config.load_app_config`) and the dataset is checked
*before* Ray starts; then the same ServerApp/ClientApp as ``flwr run`` runs on Flower's simulation engine.
Each run writes its resolved config (Hydra's ``.hydra/``), ``run.json``, ``metrics.jsonl`` and
``final_model.npz`` into its own output directory.

Flower 1.42 marks ``flwr.simulation.run_simulation`` deprecated in favour of ``flwr run`` and offers no in-process
runtime in its place. We keep it here because ``flwr run`` against a simulation-mode SuperLink starts every run
about 7 s later on the 2-core machine (a second process importing torch, Opacus and Flower again, and Flower's own
``ray.init`` with a job-level runtime_env), and because an engine that dies must stop this process's ServerApp
(:func:`run`); the ServerApp/ClientApp it runs are exactly the ones ``flwr run`` uses (docs/running.md: Flower API).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from apps.local_ray import start_local_ray, use_ray_env, worker_runtime_env
from fl_app.allocator import limit_malloc_arenas
from fl_app.checkpoint import resolve_start
from fl_app.config import AppConfig, ConfigError, load_app_config
from fl_app.config.known_keys import check_override_keys
from fl_app.config.overrides import CONF_DIR
from fl_app.data.datasets import DatasetUnavailableError, check_dataset

if TYPE_CHECKING:  # imported where it runs: a misspelt key is refused before the strategies' import (main())
    from apps.server_app import ServerRun


def simulation_nodes(config: AppConfig) -> int:
    """SuperNodes to simulate: M with population=nodes or distributed DP; otherwise one per concurrent worker (results
    do not depend on it, see strategies.population), so that cohort_size=auto gives every worker one cohort a round.

    When joining a Ray cluster (``simulation.ray_address``) the driver must already be connected
    (:func:`join_ray_cluster`): the count comes from the cluster's nodes, not from this machine.
    """
    if config.population == "nodes" or config.privacy.placement == "distributed":
        # Distributed DP: a client's protocol state lives in its node's context between the stages, so no two
        # clients of a round may share a node (strategies/secure_sum.py refuses it).
        return config.dataset.num_clients
    return max(1, min(config.dataset.num_clients, concurrent_workers(config)))


def concurrent_workers(config: AppConfig) -> int:
    """ClientApps that can run at once: the size of the actor pool Flower's Ray backend will build.

    Mirrors ``flwr.simulation.ray_transport.ray_actor.pool_size_from_resources``: per Ray node,
    ``min(int(CPUs / client_cpus), int(GPUs / client_gpus))`` (the GPU term only when client_gpus > 0).
    """
    sim = config.simulation
    if sim.ray_address is not None:
        return _cluster_workers(sim.client_cpus, sim.client_gpus)
    workers = int(_total_cpus(config) / sim.client_cpus)
    if sim.client_gpus > 0:
        # The local Ray detects the same CUDA devices torch sees (both honour CUDA_VISIBLE_DEVICES). With none,
        # Flower's pool would be empty and the backend refuses to start; the CPU count is kept for that message.
        gpus = torch.cuda.device_count()
        if gpus > 0:
            workers = min(workers, int(gpus / sim.client_gpus))
    return max(1, workers)


def _cluster_workers(client_cpus: float, client_gpus: float) -> int:
    import ray
    from flwr.simulation.ray_transport.ray_actor import pool_size_from_resources

    if not ray.is_initialized():
        raise RuntimeError("simulation.ray_address is set but this process has not joined the cluster yet")
    # Flower's own function, so that the SuperNode count equals the actors it will create; it raises a
    # ValueError naming the resources when the cluster cannot host a single client.
    return pool_size_from_resources({"num_cpus": client_cpus, "num_gpus": client_gpus})


def _total_cpus(config: AppConfig) -> int:
    return config.simulation.total_cpus or os.cpu_count() or 1


def backend_config(config: AppConfig) -> dict[str, Any]:
    """Flower's Ray backend config: resources per ClientApp and the arguments of ``ray.init``."""
    sim = config.simulation
    init_args: dict[str, Any] = {
        "logging_level": "ERROR",
        "log_to_driver": True,
        # Flower 1.42 defaults to False as well; pinned so that an upgrade cannot switch the dashboard UI on. The
        # dashboard process itself, its agent, the runtime-env agent, the log monitor and the autoscaler monitor
        # are started by every ray.init in Ray 2.55 whatever its arguments (docs/running.md, Scale out); usage stats are
        # already off (ray.init sets RAY_USAGE_STATS_ENABLED=0 for release wheels).
        "include_dashboard": False,
        # "local": a Ray of this run's own even when RAY_ADDRESS is set or a `ray start` cluster is running; a
        # bare ray.init() would silently join either (and then refuse num_cpus).
        "address": sim.ray_address or "local",
    }
    if sim.ray_address is None and sim.total_cpus is not None:
        # Ray refuses num_cpus/num_gpus when joining a cluster: its resources are fixed by `ray start`.
        init_args["num_cpus"] = sim.total_cpus
    return {"client_resources": {"num_cpus": sim.client_cpus, "num_gpus": sim.client_gpus}, "init_args": init_args}


def join_ray_cluster(config: AppConfig) -> None:
    """Connect this process to the running Ray cluster at ``simulation.ray_address`` (before the simulation, so
    :func:`simulation_nodes` can size the SuperNodes from the cluster; Flower's backend then reuses the
    connection and disconnects at the end, which leaves the cluster running).

    Same ``ray.init`` call as Flower's backend makes (it skips its own when Ray is initialised): its init_args
    and a runtime_env that hands the driver's ``sys.path`` to the workers as PYTHONPATH. Workers on other
    machines import the project from their own environment (docs/running.md, Scale out: a Ray cluster).
    """
    import ray
    from flwr.common.logger import log

    init_args = backend_config(config)["init_args"]
    use_ray_env()
    ray.init(runtime_env=worker_runtime_env(), **init_args)
    resources = ray.cluster_resources()
    log(
        logging.INFO,
        "Joined the Ray cluster at %s (GCS %s): %d node(s), %g CPU, %g GPU",
        config.simulation.ray_address,
        ray.get_runtime_context().gcs_address,
        len([n for n in ray.nodes() if n.get("Alive")]),
        resources.get("CPU", 0),
        resources.get("GPU", 0),
    )


def check_resources(config: AppConfig) -> None:
    """Each ClientApp's resources against this machine, for a local Ray: Flower's engine builds an empty actor pool
    when no client fits, ends at once, and would leave the ServerApp waiting ``round_timeout`` every round. A joined
    cluster's resources are checked by Flower's own sizing (:func:`_cluster_workers`)."""
    sim = config.simulation
    if sim.ray_address is not None:
        return
    cpus = _total_cpus(config)
    if sim.client_cpus > cpus:
        raise ConfigError(
            f"invalid config value simulation.client_cpus={sim.client_cpus}: more than the {cpus} CPU(s) this run "
            "may use (simulation.total_cpus, else this machine's cores): no ClientApp could start"
        )
    if sim.client_gpus > 0 and torch.cuda.device_count() == 0:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise ConfigError(
            f"invalid config value simulation.client_gpus={sim.client_gpus}: no CUDA GPU is visible to this process "
            f"(torch.cuda.device_count() == 0{f', CUDA_VISIBLE_DEVICES={visible!r}' if visible is not None else ''})"
            ": no ClientApp could start; set simulation.client_gpus=0 to train on the CPU"
        )


def preflight(config: AppConfig, output_dir: Path) -> ServerRun:
    """Checks that must fail before Ray starts, and the run they clear: the clients' resources fit this machine; the
    run is prepared (:class:`ServerRun`: the strategy built once, so noise calibration and the accountant are set up
    and an unreachable target epsilon raises ValueError); missing data raises DatasetUnavailableError with the
    how-to message; a Ray cluster to join that does not answer raises ConnectionError."""
    from apps.server_app import ServerRun

    check_resources(config)
    server_run = ServerRun.prepare(config, output_dir)
    # Both splits read and checked, nothing kept: this process evaluates on the test split and trains on none.
    check_dataset(config.dataset.name, config.dataset.data_dir, download=config.dataset.download)
    if config.simulation.ray_address is not None:
        check_ray_address(config.simulation.ray_address)
    return server_run


def check_ray_address(address: str, timeout: float = 5.0) -> None:
    """Raise ConnectionError unless something listens at the cluster's GCS address: ray.init keeps retrying a
    wrong one for minutes (a typo would hang a sweep job). ``auto`` is checked only through RAY_ADDRESS; without
    it Ray itself fails at once when it finds no cluster."""
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS", "")
        if address in ("", "auto"):
            return
    host_port = address.split("://", 1)[-1]
    host, sep, port = host_port.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"simulation.ray_address={address!r}: expected 'auto' or host:port")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise ConnectionError(f"no Ray cluster answers at {host_port} (simulation.ray_address): {exc}") from exc


def run(server_run: ServerRun) -> None:
    """Run one simulation of the prepared ``server_run`` (:func:`preflight`'s) on Flower's simulation engine."""
    import ray
    from flwr.simulation import run_simulation

    from apps.client_app import app as client_app
    from apps.delivery import deliver_promptly
    from apps.server_app import make_server_app
    from strategies.messaging import engine_stopped, stop_waiting_for_replies

    config, output_dir = server_run.config, server_run.output_dir
    # The server's own torch work (evaluation) stays within the simulation's CPU share.
    torch.set_num_threads(_total_cpus(config))
    # Hydra's root handler would print every Flower log line a second time.
    logging.getLogger("flwr").propagate = False
    # A round's messages reach the workers when they are stored, not at Flower's next 0.1 s poll (apps/delivery.py).
    deliver_promptly()
    try:
        if config.simulation.ray_address is not None:
            join_ray_cluster(config)
        else:
            start_local_ray(backend_config(config)["init_args"])
        num_nodes = simulation_nodes(config)
        engine_stopped.clear()
        try:
            # Flower logs a deprecation warning for run_simulation here; see the module docstring and docs/running.md.
            run_simulation(
                server_app=make_server_app(server_run),
                client_app=client_app,
                num_supernodes=num_nodes,
                backend_config=backend_config(config),
            )
        except BaseException as exc:
            # Flower's engine has ended while the ServerApp's thread may still wait for replies (round_timeout
            # each round, releasing noise-only models): tell it, so that the run fails now with the engine's error.
            stop_waiting_for_replies(_error_chain(exc))
            raise
    finally:
        # Flower's backend disconnects when it ends; this covers a failure before it started (a joined cluster
        # keeps running either way, this run's actors die with its driver).
        if ray.is_initialized():
            ray.shutdown()
    if not (output_dir / "final_model.npz").exists():
        raise RuntimeError(f"the simulation did not complete; see the log above and {output_dir}/run.json")


def _error_chain(exc: BaseException) -> str:
    """``exc`` and the errors that caused it, outermost first (Flower wraps the engine's own error twice)."""
    chain: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 5:
        chain.append(f"{type(seen).__name__}: {seen}")
        seen = seen.__cause__ or seen.__context__
    return " <- ".join(chain)


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    # Before Ray and Flower start their threads in this process (fl_app/allocator.py).
    limit_malloc_arenas()
    # Hydra's root handler would print every Flower log line a second time, from the config checks' on.
    logging.getLogger("flwr").propagate = False
    # The strategies register their names, which the config is validated by (imported here, not at the top: a
    # misspelt key on the command line is refused before this import's seconds).
    import strategies.registry  # noqa: F401

    try:
        start = resolve_start(load_app_config(cfg), Path(HydraConfig.get().runtime.output_dir))
        config, output_dir = start.config, start.output_dir
        server_run = None if start.completed else preflight(config, output_dir)
    except (ConfigError, ConnectionError, DatasetUnavailableError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    if server_run is None:  # resume=auto, and the run there has completed: a sweep job already done
        print(f"{output_dir}: this run has completed already (resume=auto); nothing to run")
    else:
        run(server_run)
    from fl_app.metrics import read_metrics

    records = read_metrics(output_dir / "metrics.jsonl")
    accs = [r["test_accuracy"] for r in records if r.get("test_accuracy") is not None]
    return float(accs[-1]) if accs else math.nan


def check_command_line(args: list[str]) -> None:
    """Refuse a misspelt setting on the command line before Hydra composes (exit 2, the key and its likely fix),
    as the validator refuses a bad value; Hydra's own flags (other than --multirun) leave the check to Hydra."""
    if any(arg.startswith("-") and arg not in ("-m", "--multirun") for arg in args):
        return
    try:
        check_override_keys(args, CONF_DIR)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    check_command_line(sys.argv[1:])
    main()
