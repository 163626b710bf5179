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

Imports nothing heavy (Ray only when called), so that bench/flower_floor.py can start Ray the same way.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any


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
    ray.init(**init_args)
