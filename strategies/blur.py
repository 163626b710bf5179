"""DP-FedAvg-blur and DP-FedAvg-blurs (Cheng, Wang, Zhang, Cheng, CVPR 2022), as defined in docs/algorithms.md
("Definitions of the baselines").

* blur — the local objective gains R(w) = (λ/2)·max(0, ‖w − w^t‖ − C)² (differentiated through autograd,
  ``clients/regularizers.py``; λ = ``strategy.blur_coef``), which keeps the update inside the clipping ball.
* blurs — BLUR plus local update sparsification (LUS): keep the per-layer top-k of |Δ| (fraction
  ``strategy.sparsity``) before clipping, then **dense** noise. Because the noise covers every coordinate, the
  sparsification is part of the local computation and the Gaussian mechanism (sensitivity C) is accounted as usual.

The algorithms are :class:`FedAvgBLUR` and :class:`FedAvgBLURS`; the DP strategies are the client-level DP layer
over them.
"""

from __future__ import annotations

from dataclasses import dataclass

from fl_app.config import SparseConfig, StrategyConfig, require
from fl_app.instructions import RecipeSpec
from strategies.base import FederatedStrategy
from strategies.client_level_dp import RegisteredDP


@dataclass(frozen=True)
class BlurConfig(StrategyConfig):
    """DP-FedAvg-blur: the BLUR coefficient λ."""

    blur_coef: float = 1.0

    def check(self) -> None:
        super().check()
        require(self.blur_coef >= 0, "strategy.blur_coef", self.blur_coef, ">= 0")


@dataclass(frozen=True)
class BlurSparseConfig(BlurConfig, SparseConfig):
    """DP-FedAvg-blurs: BLUR plus local update sparsification keeping the fraction p per layer (both checks)."""


class FedAvgBLUR(FederatedStrategy):
    """FedAvg whose local objective gains BLUR's regularizer around the clip norm C."""

    settings_class = BlurConfig
    local_optimizer = "sgd"

    def client_recipe(self) -> RecipeSpec:
        return RecipeSpec(kind="dense", blur_coef=self.config.strategy.blur_coef)


class FedAvgBLURS(FederatedStrategy):
    """FedAvgBLUR with local update sparsification (the per-layer top-k of the update before clipping)."""

    settings_class = BlurSparseConfig
    local_optimizer = "sgd"

    def client_recipe(self) -> RecipeSpec:
        s = self.config.strategy
        return RecipeSpec(kind="lus", sparsity=s.sparsity, blur_coef=s.blur_coef)


class DPFedAvgBLUR(RegisteredDP):
    """``ClientLevelDP(FedAvgBLUR(config))``, by the name ``dp_fedavg_blur``."""

    config_name = "dp_fedavg_blur"
    algorithm = FedAvgBLUR


class DPFedAvgBLURS(RegisteredDP):
    """``ClientLevelDP(FedAvgBLURS(config))``, by the name ``dp_fedavg_blurs``."""

    config_name = "dp_fedavg_blurs"
    algorithm = FedAvgBLURS
