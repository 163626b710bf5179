"""DP-FedSAM (Shi et al., CVPR 2023; journal version Alg. 1 option I): local SAM (journal Eqs. 8–9) so the local
models are flatter and survive clipping and noise better, then the client-level Gaussian mechanism of
docs/mechanisms.md, 2–4 (journal Eqs. 10–11): the client-level DP layer over the plain FedSAM."""

from __future__ import annotations

from strategies.client_level_dp import RegisteredDP
from strategies.fedavg import FedSAM


class DPFedSAM(RegisteredDP):
    """``ClientLevelDP(FedSAM(config))``, by the name ``dp_fedsam``."""

    config_name = "dp_fedsam"
    algorithm = FedSAM
