"""DP-FedSAM-topk (journal Alg. 1 option II, Eq. 12): DP-FedSAM whose noisy update keeps only the per-layer top-k
coordinates (k_l = ⌈p·d_l⌉), which removes most of the noise energy.

Where the mask is computed decides what the accountant covers (docs/algorithms.md):

The algorithm is :class:`FedSAMTopK`; DP-FedSAM-topk is the client-level DP layer over it.

* ``placement=server`` (default), ``mask_source=noisy`` — the server takes the per-layer top-k of the *noised
  average*: post-processing of exactly the output the accountant analyses, so ε holds.
* ``placement=client`` (the papers' form; needs ``sampling=fixed``), ``mask_source=noisy`` — each client masks its
  own noisy update. That is post-processing of the individual noisy updates, each carrying only noise σC/√m, not of
  the noised aggregate, so the accountant's ε does not cover it; the run says so.
* ``mask_source=clean`` — the mask comes from the clean update and leaks its support: not covered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fl_app.config import MaskedConfig
from fl_app.instructions import RecipeSpec
from fl_app.privacy.pipeline import Mechanism, ServerTopK
from strategies.client_level_dp import RegisteredDP
from strategies.fedavg import FedSAM


@dataclass(frozen=True)
class TopKConfig(MaskedConfig):
    """DP-FedSAM-topk: the top-k mask of the noisy update (covered) or of the clean one (not covered)."""

    MASK_SOURCES: ClassVar[tuple[str, ...]] = ("noisy", "clean")
    mask_source: str = "noisy"


class FedSAMTopK(FedSAM):
    """FedSAM whose update keeps only the per-layer top-k coordinates: of the (noised, under the DP layer) average
    on the server, or of each client's own update."""

    distributed_placement_refusal = (
        "its sparsification acts on noise added in the model's coordinates; distributed DP adds the clients' "
        "Skellam shares to a rotated integer encoding, which this analysis does not cover"
    )

    settings_class = TopKConfig

    @property
    def _server_masks(self) -> bool:
        return self.placement.name == "server" and self.config.strategy.mask_source == "noisy"

    def client_recipe(self) -> RecipeSpec:
        if self._server_masks:
            return RecipeSpec()
        kind = "topk_noisy" if self.config.strategy.mask_source == "noisy" else "topk_clean"
        return RecipeSpec(kind=kind, sparsity=self.config.strategy.sparsity)

    def server_mechanisms(self) -> tuple[Mechanism, ...]:
        return (ServerTopK(self.config.strategy.sparsity),) if self._server_masks else ()

    def not_covered_reason(self) -> str | None:
        if self.config.strategy.mask_source == "clean":
            return "top-k support computed from the clean update (mask_source=clean) is released unprotected"
        if self.placement.name == "client":
            return (
                "each client's top-k mask is computed from its own noisy update (noise sigma*C/sqrt(m)), "
                "not from the noised aggregate the accountant analyses"
            )
        return None


class DPFedSAMTopK(RegisteredDP):
    """``ClientLevelDP(FedSAMTopK(config))``, by the name ``dp_fedsam_topk``."""

    config_name = "dp_fedsam_topk"
    algorithm = FedSAMTopK
