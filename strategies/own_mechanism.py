"""Strategies private by a mechanism of their own rather than by the client-level DP layer (Noisy-FedAvg/FedProx:
the clients' noise and the f-DP bound of the run; DP-FTRL: correlated noise and the factorization's bound). Each is
built with its :class:`~strategies.client_dp.private_rounds.PrivateRounds` and accounts its releases with the
ledger its ``make_ledger()`` makes; the layer refuses to wrap it."""

from __future__ import annotations

from typing import Any, ClassVar

from flwr.serverapp import PrivacyAccountant

from fl_app.config import AppConfig, ConfigError
from strategies.base import FederatedStrategy
from strategies.client_dp.private_rounds import PrivateRounds


class PrivateByItsOwnMechanism(FederatedStrategy):
    """A strategy whose rounds are private by its own mechanism and bound."""

    #: What its ε is, in place of a composition of sampled Gaussian events (why an accountant cannot be given).
    own_bound: ClassVar[str]
    #: Whether the server releases the noisy average over the fixed m (False: its clients add all of the noise).
    server_average: ClassVar[bool] = True
    distributed_placement_refusal = (
        "it is private by a mechanism and bound of its own; distributed DP replaces the subsampled Gaussian "
        "mechanism of the client-level DP layer"
    )

    def __init__(
        self, config: AppConfig | None = None, /, *, accountant: PrivacyAccountant | str | None = None, **kwargs: Any
    ) -> None:
        """As :class:`FederatedStrategy`; ``accountant`` can only be a name (``privacy.accountant``, which its bound
        does not use)."""
        if isinstance(accountant, str):
            kwargs["accountant"] = accountant
        elif accountant is not None:
            raise ConfigError(
                f"{type(self).__name__}: its epsilon is {self.own_bound}, not a composition of sampled Gaussian "
                "events: an accountant cannot be given"
            )
        super().__init__(config, privacy=PrivateRounds(server_average=self.server_average), **kwargs)
