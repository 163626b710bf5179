"""The ``simulation`` section: the resources of each client, the device, the cohorts a worker trains and how, and
the Ray to run on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fl_app.config.readers import _choice, _known_keys, _number, _optional_integer, _require
from fl_app.core.choices import COHORT_ENGINES, DEVICES, CohortEngine, Device


@dataclass(frozen=True)
class SimulationConfig:
    client_cpus: float
    client_gpus: float
    device: Device
    #: CPUs one simulation may use (Ray's num_cpus and the server's torch threads); None = every core. Set it to
    #: cores / n_jobs when a launcher runs n_jobs simulations at once.
    total_cpus: int | None = None
    #: Clients per train message (population=virtual): 1 = one message per client; k > 1 = cohorts of about k
    #: clients balanced by local work; "auto" = one cohort per worker (SuperNode) in simulation, 1 in deployment.
    cohort_size: int | Literal["auto"] = "auto"
    #: How a worker trains a cohort: one client after another, or all at once on stacked models (torch.func);
    #: "auto" = captured on a GPU, sequential on a CPU.
    cohort_engine: Literal["auto"] | CohortEngine = "auto"
    #: None = start a local Ray for this run; "auto" or "host:port" = join that running Ray cluster.
    ray_address: str | None = None


def _validate_simulation(section: Mapping[str, Any]) -> SimulationConfig:
    _known_keys(section, SimulationConfig, "simulation")
    p = "simulation"
    cpus = _number(section, "client_cpus", p)
    _require(cpus > 0, "simulation.client_cpus", cpus, "> 0")
    gpus = _number(section, "client_gpus", p)
    _require(0 <= gpus <= 1, "simulation.client_gpus", gpus, "[0, 1] (a GPU fraction per client)")
    total = _optional_integer(section, "total_cpus", p, 1)
    if total is not None:
        _require(cpus <= total, "simulation.client_cpus", cpus, f"<= simulation.total_cpus ({total})")
    cohort = section.get("cohort_size", "auto")
    if cohort != "auto":
        _require(
            isinstance(cohort, int) and not isinstance(cohort, bool) and cohort >= 1,
            "simulation.cohort_size", cohort, "'auto' or an integer >= 1",
        )  # fmt: skip
    address = section.get("ray_address")
    _require(address is None or (isinstance(address, str) and address.strip() != ""),
             "simulation.ray_address", address, "null, 'auto' or 'host:port' of a running Ray cluster")  # fmt: skip
    if address is not None:
        _require(total is None, "simulation.total_cpus", total,
                 "null when joining a Ray cluster (the cluster's resources are fixed by `ray start`)")  # fmt: skip
    return SimulationConfig(
        client_cpus=cpus,
        client_gpus=gpus,
        device=_choice(section, "device", p, DEVICES),  # type: ignore[arg-type]
        total_cpus=total,
        cohort_size=cohort,
        cohort_engine=_choice(section, "cohort_engine", p, COHORT_ENGINES),  # type: ignore[arg-type]
        ray_address=address,
    )
