"""Fed-SMP (Hu, Gong, Guo, "Federated Learning with Sparsified Model Perturbation"), as defined in
docs/algorithms.md ("Definitions of the baselines"): local SGD, a per-layer sparsification mask (k_l = ⌈p·d_l⌉),
clipping, and Gaussian noise on the kept coordinates only.

* Fed-SMP-randk — the server draws one random mask per round from its public round stream and sends it to every
  sampled client; it does not depend on any data, so the round is accounted exactly like DP-FedAvg (the gain is
  less noise energy, not a smaller ε). ``rescale`` sends (Δ ⊙ mask)/p (unbiased sparsification).
* Fed-SMP-topk — ``mask_source=local`` (as published): each client's own top-k of |Δ|; the support depends on
  private data and is sent in the clear, so the accountant does not cover it. ``mask_source=global`` (DP-sound):
  the per-layer top-k of |last round's global update| (public), shared by all clients; round 1 uses a public
  random mask.

The algorithms are :class:`FedAvgRandK` and :class:`FedAvgTopK`; Fed-SMP is the client-level DP layer over them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fl_app.config import MaskedConfig, SparseConfig
from fl_app.instructions import STREAM_ROUND_MASK, RecipeSpec
from fl_app.privacy import mechanisms as mech
from strategies.base import FederatedStrategy
from strategies.client_level_dp import RegisteredDP


@dataclass(frozen=True)
class RandKConfig(SparseConfig):
    """Fed-SMP-randk: send (update ⊙ mask) / p (unbiased) instead of update ⊙ mask."""

    rescale: bool = True


@dataclass(frozen=True)
class SMPTopKConfig(MaskedConfig):
    """Fed-SMP-topk: each client's own top-k (as published; not covered) or last round's public global top-k."""

    MASK_SOURCES: ClassVar[tuple[str, ...]] = ("local", "global")
    mask_source: str = "local"


class FedAvgRandK(FederatedStrategy):
    """FedAvg whose clients send their update on the round's public random mask (Fed-SMP-randk's algorithm)."""

    distributed_placement_refusal = (
        "its sparsification acts on noise added in the model's coordinates; distributed DP adds the clients' "
        "Skellam shares to a rotated integer encoding, which this analysis does not cover"
    )

    settings_class = RandKConfig
    local_optimizer = "sgd"

    def client_recipe(self) -> RecipeSpec:
        s = self.config.strategy
        return RecipeSpec(kind="shared_mask", sparsity=s.sparsity, rescale=s.rescale)

    def round_mask(
        self, server_round: int, global_weights: list[np.ndarray], previous_global: list[np.ndarray]
    ) -> list[np.ndarray] | None:
        rng = self.randomness.round_rng(server_round, STREAM_ROUND_MASK)
        return mech.randk_mask([w.shape for w in global_weights], self.config.strategy.sparsity, rng)


class FedAvgTopK(FederatedStrategy):
    """FedAvg whose clients send their update on a top-k mask, their own or last round's global one (Fed-SMP-topk's
    algorithm)."""

    distributed_placement_refusal = (
        "its sparsification acts on noise added in the model's coordinates; distributed DP adds the clients' "
        "Skellam shares to a rotated integer encoding, which this analysis does not cover"
    )

    local_optimizer = "sgd"
    settings_class = SMPTopKConfig

    @property
    def _local(self) -> bool:
        return self.config.strategy.mask_source == "local"

    def client_recipe(self) -> RecipeSpec:
        kind = "topk_local" if self._local else "shared_mask"
        return RecipeSpec(kind=kind, sparsity=self.config.strategy.sparsity, rescale=False)

    def round_mask(
        self, server_round: int, global_weights: list[np.ndarray], previous_global: list[np.ndarray]
    ) -> list[np.ndarray] | None:
        if self._local:
            return None
        p = self.config.strategy.sparsity
        if not previous_global:
            shapes = [w.shape for w in global_weights]
            return mech.randk_mask(shapes, p, self.randomness.round_rng(server_round, STREAM_ROUND_MASK))
        last_update = [w - v for w, v in zip(global_weights, previous_global, strict=True)]
        return mech.topk_mask(last_update, p)

    @property
    def uses_previous_global(self) -> bool:
        return not self._local

    def not_covered_reason(self) -> str | None:
        return "data-dependent top-k support" if self._local else None


class FedSMPRandK(RegisteredDP):
    """``ClientLevelDP(FedAvgRandK(config))``, by the name ``fed_smp_randk``."""

    config_name = "fed_smp_randk"
    algorithm = FedAvgRandK


class FedSMPTopK(RegisteredDP):
    """``ClientLevelDP(FedAvgTopK(config))``, by the name ``fed_smp_topk``."""

    config_name = "fed_smp_topk"
    algorithm = FedAvgTopK
