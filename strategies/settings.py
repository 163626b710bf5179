"""The settings that depend on where a run happens, every ``auto`` resolved once, by one rule each.

Flower's simulation engine and a real SuperLink differ in what a setting should default to:

- ``privacy.secure_noise=auto``: seeded streams in simulation (reproducible), the OS CSPRNG against a real SuperLink.
  Seeded randomness in a deployment sends the seed to every sampled client (it re-derives the sampling and the
  server's noise from it): refused unless ``privacy.allow_seeded_deployment``, and then logged loudly.
- ``privacy.client_statistics=auto``: raw in simulation, none against a real SuperLink (docs/PRIVACY.md).
- ``simulation.cohort_size=auto``: one cohort per worker in simulation; one message per client against a real
  SuperLink, where a node is a client's machine.
- ``population=virtual`` against a real SuperLink sends each SuperNode the ids of the sampled clients it is to train:
  the SuperNodes learn (part of) the sample, which the accounting's amplification by sampling assumes secret. Refused
  unless ``allow_virtual_deployment``, and then logged loudly and stated in ``run.json``.

The ServerApp resolves them (:func:`apps.server_app.run_federated`, before anything is published); a strategy that
a user's own ServerApp starts resolves them in ``start()`` from the grid it is given, through the same
:meth:`RunSettings.resolve`. ``simulation.device`` and ``simulation.cohort_engine`` stay ``auto`` on the wire: they
depend on the machine that trains (a client's GPU), which each worker resolves for itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from logging import ERROR
from typing import Literal

from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.supercore.constant import TaskType
from flwr.superlink.grid import InMemoryGrid

from fl_app.config import AppConfig, ConfigError
from fl_app.instructions import resolve_cohort_engine
from fl_app.models import build_model_for_dataset, check_vectorizable, resolve_device

#: ``cohort_size`` resolved: a fixed number of clients per message (1 = one message per client), or one cohort per
#: connected node.
CohortSize = int | Literal["per_node"]


@dataclass(frozen=True)
class RunSettings:
    """A run's environment-dependent settings with no ``auto`` left."""

    simulation: bool
    secure_noise: bool
    client_statistics: Literal["raw", "noisy", "none"]
    cohort_size: CohortSize

    @classmethod
    def resolve(cls, config: AppConfig, simulation: bool) -> RunSettings:
        """``config``'s settings for a run in simulation (``simulation=True``) or against a real SuperLink."""
        p = config.privacy
        secure = (not simulation) if p.secure_noise == "auto" else bool(p.secure_noise)
        if not simulation and not secure:
            if not p.allow_seeded_deployment:
                raise ConfigError(
                    "invalid config value privacy.secure_noise=false against a real SuperLink: seeded randomness "
                    "sends the seed to every sampled client, who can then recompute who was sampled and the "
                    "server's noise (no privacy against clients); use secure_noise=auto or true, or set "
                    "privacy.allow_seeded_deployment=true to run it anyway (docs/PRIVACY.md)"
                )
            log(
                ERROR,
                "SEEDED RANDOMNESS IN A DEPLOYMENT (privacy.allow_seeded_deployment=true): every sampled client "
                "receives the seed and can recompute the sampling and the server's noise; the printed epsilon "
                "does not hold against clients",
            )
        if not simulation and config.population == "virtual":
            _check_virtual_deployment(config)
        statistics = p.client_statistics
        if statistics == "auto":  # distributed DP: the server has no client's values to publish
            statistics = "raw" if simulation and p.placement != "distributed" else "none"
        size = config.simulation.cohort_size
        cohort_size: CohortSize
        if config.population != "virtual":
            cohort_size = 1  # every node is one client: nothing to group
        elif size == "auto":
            # Secure aggregation's participant is one client: distributed DP sends one client a message.
            cohort_size = "per_node" if simulation and p.placement != "distributed" else 1
        else:
            cohort_size = int(size)
        return cls(simulation=simulation, secure_noise=secure, client_statistics=statistics, cohort_size=cohort_size)


#: What SuperNodes learn of the sample when ``population=virtual`` runs against a real SuperLink (``run.json``).
VIRTUAL_DEPLOYMENT_DISCLOSURE = (
    "population=virtual against a real SuperLink (allow_virtual_deployment=true): each SuperNode is sent the ids of "
    "the sampled clients whose partitions it trains, so the SuperNodes together learn every round's sample; epsilon "
    "holds against the published models, not against SuperNodes"
)


def _check_virtual_deployment(config: AppConfig) -> None:
    if not config.allow_virtual_deployment:
        raise ConfigError(
            "invalid config value population=virtual against a real SuperLink: every SuperNode would be sent the ids "
            "of the sampled clients it is to train and read their partitions, so SuperNodes learn who was sampled "
            "(the secret the accounting's amplification rests on); use population=nodes (each SuperNode is one "
            "client and trains its own partition), or set allow_virtual_deployment=true to run it anyway "
            "(docs/PRIVACY.md)"
        )
    log(ERROR, "VIRTUAL POPULATION IN A DEPLOYMENT: %s", VIRTUAL_DEPLOYMENT_DISCLOSURE)


def initial_cohort_size(config: AppConfig) -> CohortSize:
    """The cohort size before :meth:`RunSettings.resolve` knows where the run happens: ``auto`` is one message per
    client until then."""
    size = config.simulation.cohort_size
    return 1 if size == "auto" or config.population != "virtual" else int(size)


def is_simulation(grid: Grid) -> bool:
    """True under Flower's simulation engine: the in-memory grid of ``run_simulation``, or a run whose primary task
    is ``flwr-simulation`` (``flwr run`` against a ``--simulation`` SuperLink, which hands the ServerApp an HTTP
    grid)."""
    if isinstance(grid, InMemoryGrid):
        return True
    try:
        return str(grid.run.primary_task_type) == str(TaskType.SIMULATION)
    except Exception:  # a grid without run details (e.g. a test double) is not the simulation engine
        return False


def check_cohort_engine(config: AppConfig) -> None:
    """Fail at construction (before Ray starts) if cohorts would be trained vectorized on a model that cannot be."""
    sim = config.simulation
    try:
        engine = resolve_cohort_engine(sim.cohort_engine, resolve_device(sim.device).type == "cuda")
    except ValueError as exc:
        raise ConfigError(f"invalid config value simulation.cohort_engine={sim.cohort_engine}: {exc}") from exc
    if sim.cohort_size == 1 or config.population != "virtual" or engine == "sequential":
        return
    try:
        check_vectorizable(build_model_for_dataset(config.model.name, config.dataset.name, seed=0))
    except ValueError as exc:
        raise ConfigError(
            f"invalid config value simulation.cohort_engine={sim.cohort_engine}: {exc}; "
            "set simulation.cohort_engine=sequential or simulation.cohort_size=1"
        ) from exc
