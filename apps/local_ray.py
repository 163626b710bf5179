"""This run's own Ray for Flower's simulation engine, started so that its actors take the workers Ray prestarts.

Flower's Ray backend (``RayBackend.init_ray`` in ``flwr.server.superlink.fleet.vce.backend.raybackend``) calls
``ray.init(runtime_env={"env_vars": {"PYTHONPATH": <the driver's sys.path>}}, ...)`` unless Ray is initialised
already. A job-level runtime_env makes every actor wait for Ray's runtime-env agent and for a worker process started
for that environment, while the workers Ray prestarts when the driver connects (one per CPU, with no runtime_env)
sit idle. :func:`start_local_ray` hands the same PYTHONPATH through the environment instead, which the raylet and so
every worker inherit from this process: the workers import from the same path, the actors take the prestarted
workers, and Flower's engine alone reaches its first local step 0.5–1.6 s sooner on the 2-core machine
(``python -m bench --peer pfl --only PEER``, docs/performance.md). Flower's backend then skips its own ``ray.init``.

A Ray cluster that is joined (``simulation.ray_address``) keeps the runtime_env (:func:`apps.main.join_ray_cluster`):
its workers are started by other machines' raylets, which do not inherit this process's environment.

Ray's FutureWarning at ``ray.init`` ("Ray will no longer override accelerator visible devices env var if
num_gpus=0 ...; set RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0") is answered as it says: :data:`RAY_ENV` sets that
variable to 0 in the driver before Ray starts (:func:`use_ray_env`), so that the raylet and every worker it starts
inherit it, and in the runtime_env of a joined cluster's workers (:func:`worker_runtime_env`). A ClientApp that Ray
gave no GPU then sees the machine's GPUs (Ray's coming default): :func:`fl_app.models.ray_gave_no_gpu` keeps
``device=auto`` on the CPU there, as Ray's hiding of the GPUs did.

Imports nothing heavy (Ray only when called), so that bench/flower_floor.py can start Ray the same way.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

#: What the driver sets before ``ray.init`` and hands every worker: Ray's own opt-in to leaving the accelerator
#: env vars of a task or actor with ``num_gpus=0`` alone (its FutureWarning names it; the default of later Rays).
RAY_ENV = {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}


def use_ray_env() -> None:
    """Set :data:`RAY_ENV` in this process (a value the user set is kept): before ``ray.init``, which reads it,
    and before Ray's processes start, which inherit it."""
    for key, value in RAY_ENV.items():
        os.environ.setdefault(key, value)


def worker_runtime_env() -> dict[str, Any]:
    """The runtime_env of a joined cluster's workers (their raylets do not inherit this process's environment):
    the driver's import path (:func:`driver_pythonpath`) and :data:`RAY_ENV`."""
    return {"env_vars": {"PYTHONPATH": driver_pythonpath(), **{k: os.environ.get(k, v) for k, v in RAY_ENV.items()}}}


def driver_pythonpath() -> str:
    """The driver's ``sys.path`` followed by its PYTHONPATH, each entry once: what Flower's backend hands the
    workers (it appends the old PYTHONPATH every time, so repeated runs in one process, e.g. a Hydra sweep, would
    grow it)."""
    entries = [*sys.path, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return os.pathsep.join(dict.fromkeys(entries))


def start_local_ray(init_args: Mapping[str, Any]) -> None:
    """``ray.init(**init_args)`` for a Ray of this run's own, the workers' import path in the inherited
    environment (module docstring)."""
    import ray

    os.environ["PYTHONPATH"] = driver_pythonpath()
    use_ray_env()
    ray.init(**init_args)
