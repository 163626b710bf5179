"""The ``server_optimizer`` section: how the server moves the global model along the round's released average
(fl_app/server_optimizers.py, or Flower's own strategy of that name: strategies/flower_step.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fl_app.config.readers import _choice, _known_keys, _number, _require
from fl_app.core.choices import FLOWER_SERVER_STEPS, SERVER_OPTIMIZERS

#: The server learning rate η each optimizer gets when ``strategy.server_lr`` is null: the best server learning rates
#: Reddi et al. ("Adaptive Federated Optimization", ICLR 2021, Appendix: the tuned (η_l, η) grids) report for their
#: image-classification tasks with τ = 10⁻³ — 10⁻¹ for FedAdagrad, 10⁻² for FedAdam and FedYogi — and 1 for
#: FedAvg's plain step and FedAvgM (η = 1 is FedAvg itself). An adaptive step of size 1 moves every coordinate by
#: about 1 per round, which diverges on these models.
DEFAULT_SERVER_LR: dict[str, float] = {"sgd": 1.0, "momentum": 1.0, "adagrad": 0.1, "adam": 0.01, "yogi": 0.01}
#: The same for Flower's strategies of each kind (FedAvg's mean has no step size: its η is 1).
DEFAULT_SERVER_LR.update(flower_fedavg=1.0, flower_fedavgm=1.0, flower_fedadagrad=0.1, flower_fedadam=0.01,
                         flower_fedyogi=0.01)  # fmt: skip


@dataclass(frozen=True)
class ServerOptimizerConfig:
    """How the server moves the global model along the round's released average (fl_app/server_optimizers.py);
    the step size is ``strategy.server_lr``."""

    name: str = "sgd"
    #: beta1: momentum's and Adam/Yogi's first-moment decay.
    momentum: float = 0.9
    #: beta2: Adam/Yogi's second-moment decay.
    beta2: float = 0.99
    #: tau: added to the root of the second moment (adagrad, adam, yogi).
    eps: float = 1e-3


def _validate_server_optimizer(section: Mapping[str, Any]) -> ServerOptimizerConfig:
    _known_keys(section, ServerOptimizerConfig, "server_optimizer")
    p = "server_optimizer"
    defaults = ServerOptimizerConfig()
    name = _choice(section, "name", p, SERVER_OPTIMIZERS + FLOWER_SERVER_STEPS)
    momentum = _number(section, "momentum", p) if "momentum" in section else defaults.momentum
    _require(0 <= momentum < 1, "server_optimizer.momentum", momentum, "beta1 in [0, 1)")
    beta2 = _number(section, "beta2", p) if "beta2" in section else defaults.beta2
    _require(0 <= beta2 < 1, "server_optimizer.beta2", beta2, "beta2 in [0, 1)")
    eps = _number(section, "eps", p) if "eps" in section else defaults.eps
    _require(eps > 0, "server_optimizer.eps", eps, "tau > 0")
    return ServerOptimizerConfig(name=name, momentum=momentum, beta2=beta2, eps=eps)
