"""DP-FedSAM (Shi et al., CVPR 2023; journal version Alg. 1 option I): local SAM (journal Eqs. 8–9) so the local
models are flatter and survive clipping and noise better, then the client-level Gaussian mechanism of
docs/mechanisms.md, 2–4 (journal Eqs. 10–11)."""

from __future__ import annotations

from strategies.base import FederatedStrategy


class DPFedSAM(FederatedStrategy):
    config_name = "dp_fedsam"
    private = True
    local_optimizer = "sam"
