"""Where the Gaussian noise of the round is added (``privacy.placement``; journal Eq. 11, docs/mechanisms.md, 4): a
choice of object, not a flag tested across the round.

Both give the released average the same law N(0, σ²C²/m²) over the fixed denominator m, the one the ledger
accounts (:func:`fl_app.privacy.mechanisms.gaussian_noise_std`):

- :class:`ServerPlacement` (default): the server adds N(0, σ²C²/m²) to the average and re-clips every reply to C
  (a cohort's sum to k·C): it trusts no client's clip.
- :class:`ClientPlacement` (needs fixed-size sampling): each client adds N(0, σ²C²/m) to its clipped update, and the
  server only tops the noise up for the clients that did not contribute
  (:func:`~fl_app.privacy.mechanisms.client_noise_topup_std`); the aggregator sees noised updates.

A third placement has a noise of its own: :class:`DistributedPlacement` (distributed DP, docs/mechanisms.md): each
client adds a share of Skellam noise to its integer-encoded update and secure aggregation gives the server only the
sum (strategies/secure_sum.py); the server adds nothing, clips nothing it cannot see, and its ledger is the distributed
Skellam mechanism's, against the released models' consumers and against the server itself. Its σ is configured or
calibrated on the Skellam bound; its threshold t, unset, is the largest that keeps the visible aborts of samples
below t within δ/10 of the models' guarantee (fl_app/privacy/distributed/mechanism.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from logging import INFO, WARNING

import numpy as np
from flwr.common.logger import log
from scipy import stats

from fl_app.config import AppConfig, DPConfig
from fl_app.models import build_model_for_dataset, weight_shapes
from fl_app.privacy import mechanisms as mech
from fl_app.privacy.distributed.mechanism import (
    DistributedLedger,
    DistributedSkellamNoise,
    calibrated_parameters,
    default_threshold,
)
from fl_app.privacy.distributed.skellam import SkellamParameters
from fl_app.privacy.pipeline import Mechanism

#: The sample size distributed DP's scale is chosen for: the Poisson sample's (1 − this) quantile; a larger sample
#: only raises the round's overflow probability (a wrap is detected), never what the ledger accounts.
SAMPLE_SIZE_TAIL = 1e-9


class ServerPlacement:
    name = "server"
    #: Whether clients add their share of the noise (sent in their instructions).
    clients_add_noise = False
    #: Whether the server clips every reply again (it can only when the replies carry no noise of their own).
    server_clips = True

    #: Whether the clients' updates leave them only through secure aggregation.
    secure_aggregation = False
    #: σ where the placement's own mechanism fixes it (distributed DP's); None: the Gaussian mechanism's.
    noise_multiplier: float | None = None

    def server_noise_std(self, noise_multiplier: float, clip_norm: float, m: float, contributing: int) -> float:
        return mech.gaussian_noise_std(noise_multiplier, clip_norm, m, "server")

    def pipeline(self, mechanisms: tuple[Mechanism, ...]) -> tuple[Mechanism, ...]:
        return mechanisms

    def ledger(self, delta: float, population: int, accountant: object = None) -> None:
        return None  # the private rounds' own (the subsampled Gaussian mechanism's)


class ClientPlacement:
    name = "client"
    clients_add_noise = True
    server_clips = False

    #: Whether the clients' updates leave them only through secure aggregation.
    secure_aggregation = False
    noise_multiplier: float | None = None

    def server_noise_std(self, noise_multiplier: float, clip_norm: float, m: float, contributing: int) -> float:
        return mech.client_noise_topup_std(noise_multiplier, clip_norm, m, contributing)

    def pipeline(self, mechanisms: tuple[Mechanism, ...]) -> tuple[Mechanism, ...]:
        return mechanisms

    def ledger(self, delta: float, population: int, accountant: object = None) -> None:
        return None


class DistributedPlacement:
    """Distributed DP: the clients' Skellam shares under secure aggregation, with the run's encoding ``parameters``
    (scale, bit width, sensitivities; the same for every round)."""

    name = "distributed"
    clients_add_noise = False  # no Gaussian share: the Skellam share is added while the client encodes
    server_clips = False  # the server never sees an update to clip
    secure_aggregation = True

    def __init__(self, parameters: SkellamParameters, neighbours: int | None = None) -> None:
        self.parameters = parameters
        self.neighbours = neighbours

    @classmethod
    def for_run(
        cls, privacy: DPConfig, shapes: Sequence[tuple[int, ...]], num_clients: int, num_rounds: int
    ) -> DistributedPlacement:
        """The placement of a run of ``num_rounds`` rounds with ``privacy`` (placement=distributed), a model of
        ``shapes`` and M clients: σ is ``privacy.noise_multiplier``, or the one the Skellam bound calibrates to
        ``privacy.target_epsilon``."""
        settings = privacy.distributed
        if settings is None:
            raise ValueError("privacy.placement=distributed needs the privacy.distributed settings")
        q, delta = privacy.sample_rate, privacy.delta
        ceiling = settings.resolved_threshold(q * num_clients)
        parameters = _parameters(privacy, shapes, num_clients, num_rounds, ceiling)
        if settings.threshold is None:  # the largest t whose visible aborts cost the models' guarantee little
            epsilon = DistributedLedger(delta, num_clients, parameters).projected_epsilon(
                parameters.noise_multiplier, q, num_rounds)  # fmt: skip
            threshold = default_threshold(ceiling, epsilon, delta, num_clients, q, num_rounds)
            if threshold != ceiling:
                parameters = _parameters(privacy, shapes, num_clients, num_rounds, threshold)
        if privacy.target_epsilon is not None:
            log(INFO, "Calibrated noise multiplier sigma=%.4f for target epsilon=%.3f (delta=%.3g, q=%.4g, T=%d, "
                "distributed Skellam)", parameters.noise_multiplier, privacy.target_epsilon, delta, q,
                num_rounds)  # fmt: skip
        _warn_of_aborts(DistributedLedger(delta, num_clients, parameters), q, num_rounds)
        return cls(parameters, settings.neighbours)

    @property
    def noise_multiplier(self) -> float:
        """σ of the sum's Skellam noise over its integer sensitivity (configured or calibrated)."""
        return self.parameters.noise_multiplier

    def server_noise_std(self, noise_multiplier: float, clip_norm: float, m: float, contributing: int) -> float:
        return 0.0

    def pipeline(self, mechanisms: tuple[Mechanism, ...]) -> tuple[Mechanism, ...]:
        """The strategy's mechanisms with the Gaussian mechanism's place taken by the clients' Skellam shares."""
        return DistributedSkellamNoise.replacing_gaussian(mechanisms, self.parameters)

    def ledger(self, delta: float, population: int, accountant: object = None) -> DistributedLedger:
        """Distributed DP's own ledger; an accountant given for the subsampled Gaussian mechanism is refused."""
        if accountant is not None:
            raise ValueError("distributed DP accounts with its own Skellam accountants; pass no accountant")
        return DistributedLedger(delta, population, self.parameters)


def _parameters(
    privacy: DPConfig, shapes: Sequence[tuple[int, ...]], num_clients: int, num_rounds: int, threshold: int
) -> SkellamParameters:
    """The encoding of a run at threshold t: σ configured or calibrated to ``privacy.target_epsilon``."""
    settings = privacy.distributed
    assert settings is not None
    largest = int(stats.binom.ppf(1.0 - SAMPLE_SIZE_TAIL, num_clients, privacy.sample_rate))
    parameters = SkellamParameters(
        clip_norm=privacy.clip_norm,
        dimension=int(sum(int(np.prod(shape, dtype=np.int64)) for shape in shapes)),
        min_clients=threshold,
        max_clients=max(threshold, largest),
        noise_multiplier=privacy.noise_multiplier,
        bits=settings.bits,
        beta=settings.rounding_beta,
        overflow_target=settings.overflow_target,
    )
    if privacy.target_epsilon is None:
        return parameters
    return calibrated_parameters(parameters, privacy.target_epsilon, privacy.delta, privacy.sample_rate,
                                 num_rounds, num_clients)  # fmt: skip


def _warn_of_aborts(ledger: DistributedLedger, sample_rate: float, rounds: int) -> None:
    """A warning when the chance of a sample below t over the run's rounds adds more than δ to the models'
    guarantee (fl_app/privacy/distributed/mechanism.py)."""
    added = ledger.abort_delta(rounds, sample_rate)
    if added > ledger.delta:
        t, population = ledger.parameters.min_clients, ledger.population
        remedy = "sample more clients a round (dataset.num_clients, privacy.sample_rate)"
        if t > 2:
            remedy = f"lower privacy.distributed.threshold (t = {t}) or {remedy}"
        weak = "none (delta >= 1)" if ledger.delta + added >= 1 else "weak"
        log(WARNING, "Distributed DP: a round's sample has fewer than t = %d clients with probability up to %.3g "
            "(M = %d or a neighbouring dataset's M - 1 clients, q = %.4g) and is then visibly aborted; over %d "
            "rounds that raises the released models' delta from %.3g to %.3g: their guarantee is %s; %s", t,
            ledger.abort_probability(sample_rate), population, sample_rate, rounds, ledger.delta,
            min(1.0, ledger.delta + added), weak, remedy)  # fmt: skip


Placement = ServerPlacement | ClientPlacement | DistributedPlacement


def placement(config: AppConfig) -> Placement:
    """The placement ``privacy.placement`` names (server | client | distributed); distributed DP's encoding is for
    the weights of the run's model, its σ for the run's clients and rounds."""
    privacy = config.privacy
    if privacy.placement == "client":
        return ClientPlacement()
    if privacy.placement == "distributed":
        shapes = weight_shapes(build_model_for_dataset(config.model.name, config.dataset.name, seed=0))
        return DistributedPlacement.for_run(privacy, shapes, config.dataset.num_clients, config.num_rounds)
    return ServerPlacement()
