"""Distributed DP as a step of the privacy pipeline (:mod:`fl_app.privacy.pipeline`) and its ledger.

:class:`DistributedSkellamNoise` takes the Gaussian mechanism's place when the clients' Skellam shares, summed by
secure aggregation, are the round's noise (``privacy.placement=distributed``): it adds nothing on either side of the
pipeline (a client adds its share while it encodes, clients/secure_aggregation.py), and its release is a
:class:`~fl_app.privacy.accountants.skellam.SkellamEvent`: the sum's noise of variance ``v = (σ·Δ2)²`` — what the
``t`` clients a round needs carry at the least, so a round with more survivors has more noise than is accounted and
a client that drops out takes nothing from it — at the integer sensitivities of the run's encoding
(:class:`~fl_app.privacy.distributed.skellam.SkellamParameters`).

:class:`DistributedLedger` composes those events against both adversaries (``fl_app.privacy.accountants.skellam``):
the released models' consumers (the ε a budget guards, amplified by the secret Poisson sample) and the server (it
draws the sample, so no amplification: every round a client could take part in costs it in full; and since it sees
who takes part, what it is denied is the content of one client's update: zero-out adjacency, sensitivity C).

A round whose Poisson sample has fewer than t clients is aborted and the model does not move, which whoever sees the
models can tell: an event that depends on the secret sample and that the Skellam bound (for a mechanism that always
releases) does not cover. The ledger bounds it by coupling (a mechanism equal to the accounted one except on an
event of probability η is (ε, δ + (1 + e^ε)·η)-DP): η = Σ_rounds P(Bin(M − 1, q) ≤ t − 1), the largest chance of
such a sample over a dataset and its neighbours, added to δ in the consumers' statement (``abort_delta``). An abort
because too many sampled clients dropped out is not in η (dropouts are assumed independent of the clients' data).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from flwr.supercore.privacy_accounting import NeighboringRelation, PrivacyConfig, SamplingMethod
from scipy import stats

from fl_app.privacy.accountants.calibration import calibrate
from fl_app.privacy.accountants.skellam import SkellamAccountant, SkellamEvent
from fl_app.privacy.distributed.skellam import SkellamParameters
from fl_app.privacy.ledger import PrivacyLedger
from fl_app.privacy.pipeline import GaussianNoise, Mechanism, ReleaseParameters

__all__ = [
    "ABORT_SHARE_OF_DELTA",
    "DistributedLedger",
    "DistributedSkellamNoise",
    "calibrated_parameters",
    "default_threshold",
    "sample_below_probability",
    "skellam_event",
]


def skellam_event(parameters: SkellamParameters, noise_multiplier: float, sample_rate: float) -> SkellamEvent:
    """One release of the encoding ``parameters`` at noise multiplier σ (over Δ2) and sampling rate q."""
    l2 = parameters.l2_sensitivity
    return SkellamEvent((noise_multiplier * l2) ** 2, l2, parameters.l1_sensitivity, sample_rate)


class DistributedSkellamNoise(Mechanism):
    """The round's noise under distributed DP: the clients' Skellam shares (module docstring). Its client and
    server steps are the base class's, which change nothing: a share is added to the integers after the encoding,
    and the sum comes with its noise."""

    def __init__(self, parameters: SkellamParameters) -> None:
        self.parameters = parameters

    def privacy_event(self, release: ReleaseParameters) -> SkellamEvent:
        return skellam_event(self.parameters, release.noise_multiplier, release.sample_rate)

    @staticmethod
    def replacing_gaussian(mechanisms: tuple[Mechanism, ...], parameters: SkellamParameters) -> tuple[Mechanism, ...]:
        """``mechanisms`` with the Gaussian mechanism replaced by the clients' Skellam shares."""
        if not any(isinstance(m, GaussianNoise) for m in mechanisms):
            raise ValueError("distributed DP replaces the Gaussian mechanism, and this pipeline has none")
        return tuple(DistributedSkellamNoise(parameters) if isinstance(m, GaussianNoise) else m for m in mechanisms)


class DistributedLedger(PrivacyLedger):
    """Distributed DP's releases, against the released models' consumers and against the server (module
    docstring). ``parameters`` is the run's encoding; ``population`` M."""

    def __init__(self, delta: float, population: int, parameters: SkellamParameters) -> None:
        super().__init__(delta)
        self.parameters = parameters
        self.population = population
        self.accountant = SkellamAccountant(_config(delta, population, SamplingMethod.POISSON))
        self.server_accountant = SkellamAccountant(_config(delta, population, SamplingMethod.NO_AMPLIFICATION))

    @property
    def rounds(self) -> int:
        return self.accountant.num_releases

    def step(self, noise_multiplier: float, sample_rate: float, rounds: int = 1) -> None:
        if rounds:
            self.compose(skellam_event(self.parameters, noise_multiplier, sample_rate), rounds)

    def compose(self, event: Any, count: int = 1) -> None:
        if not isinstance(event, SkellamEvent):
            raise TypeError(f"a distributed-DP ledger accounts SkellamEvent releases, not {event!r}")
        self.accountant.compose(event, count)
        self.server_accountant.compose(event, count)

    def epsilon_at(self, delta: float) -> float:
        return self.accountant.get_epsilon(delta)

    def server_epsilon(self) -> float:
        """ε at δ against the server."""
        return self.server_accountant.get_epsilon(self.delta)

    def abort_probability(self, sample_rate: float) -> float:
        """:func:`sample_below_probability` of the run's t, M and ``sample_rate``."""
        return sample_below_probability(self.parameters.min_clients, self.population, sample_rate)

    def abort_delta(self, extra_rounds: int = 0, sample_rate: float = 0.0) -> float:
        """What the aborts of samples below t add to δ against the models' consumers after the rounds composed (and
        ``extra_rounds`` more at ``sample_rate``): (1 + e^ε)·η (module docstring), at most 1."""
        mass = sum(count * self.abort_probability(event.sample_rate) for event, count in self.accountant.compositions)
        mass += extra_rounds * self.abort_probability(sample_rate) if extra_rounds else 0.0
        if mass <= 0.0:
            return 0.0
        epsilon = self.projected_epsilon(self.parameters.noise_multiplier, sample_rate, extra_rounds)
        return 1.0 if epsilon > 700 or mass >= 1.0 else min(1.0, (1.0 + math.exp(epsilon)) * mass)

    def projected_epsilon(self, noise_multiplier: float, sample_rate: float, rounds: int = 1) -> float:
        if not rounds:
            return self.epsilon()
        return self.accountant.epsilon_after(skellam_event(self.parameters, noise_multiplier, sample_rate), rounds)

    def _models_statement(self, epsilon: float, aborts: float) -> str:
        """The guarantee against whoever sees the models, its δ with the aborts' share; none when that reaches 1."""
        t = self.parameters.min_clients
        why = f"the chance that a round's sample has fewer than t = {t} clients and is visibly aborted"
        if self.delta + aborts >= 1.0:
            return f"no client-level guarantee against whoever sees the released models ({why} makes delta >= 1)"
        return (f"client-level ({epsilon:.4g}, {self.delta + aborts:.3g})-DP against whoever sees the released models "
                f"(delta includes {aborts:.3g} for {why})")  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        return {"models": self.accountant.state_dict(), "server": self.server_accountant.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.accountant.load_state_dict(state["models"])
        self.server_accountant.load_state_dict(state["server"])

    def claim(self) -> dict[str, Any]:
        epsilon, server, aborts = self.epsilon(), self.server_epsilon(), self.abort_delta()
        p = self.parameters
        return {
            "statement": (
                f"{self._models_statement(epsilon, aborts)}; ({server:.4g}, {self.delta:.3g})-DP against the server "
                "for the content of one client's update (it sees who takes part, each round's sample, and the sum "
                "of its clients' noisy updates, never one client's)"
            ),
            "accountant": "rdp (distributed Skellam mechanism)",
            "sampling_event": "poisson (amplifies against the models' consumers only)",
            "neighbouring": "add/remove one client (the models' consumers); zero-out one client's update (the server)",
            "epsilon": epsilon,
            "delta": self.delta,
            "server_epsilon": server,
            "rounds_accounted": self.rounds,
            "distributed": {
                "mechanism": "distributed Skellam over SecAgg+",
                "bits": p.bits,
                "scale": p.scale,
                "noise_multiplier": p.noise_multiplier,
                "effective_noise_multiplier": p.effective_noise_multiplier,
                "padded_dimension": p.padded,
                "l2_sensitivity": p.l2_sensitivity,
                "l1_sensitivity": p.l1_sensitivity,
                "min_survivors": p.min_clients,
                "max_clients": p.max_clients,
                "overflow_probability": p.overflow,
                "rounding_beta": p.beta,
                "abort_probability": max(
                    (self.abort_probability(e.sample_rate) for e, _ in self.accountant.compositions), default=0.0
                ),
                "abort_delta": aborts,
                "adversaries": {
                    "models": "sees the released models; the Poisson sample is secret from it (amplified)",
                    "server": "honest-but-curious: runs secure aggregation as specified, sees the sample and the "
                    "sum (not amplified); does not collude with clients",
                },
            },
        }


def sample_below_probability(threshold: int, population: int, sample_rate: float) -> float:
    """The chance that a round's Poisson sample at rate q has fewer than t = ``threshold`` clients, for a dataset of
    M = ``population`` clients or a neighbour of it (the one with a client fewer, M − 1 candidates, is the likelier):
    such a round is aborted, visibly (module docstring)."""
    return float(stats.binom.cdf(threshold - 1, population - 1, sample_rate))


#: The share of δ the default threshold lets the aborts of samples below t add to the models' guarantee.
ABORT_SHARE_OF_DELTA = 0.1


def default_threshold(
    ceiling: int, epsilon: float, delta: float, population: int, sample_rate: float, rounds: int
) -> int:
    """The largest t ≤ ``ceiling`` (secure aggregation's ⌊m/2⌋ + 1) whose aborts over ``rounds`` rounds add at most
    :data:`ABORT_SHARE_OF_DELTA` · δ to a guarantee of ε = ``epsilon`` ((1 + e^ε)·T·P(sample < t), module
    docstring); 2 when none does (the run then warns that the models' guarantee is weak)."""
    allowed = ABORT_SHARE_OF_DELTA * delta / (1.0 + math.exp(min(epsilon, 700.0))) / rounds
    for threshold in range(ceiling, 2, -1):
        if sample_below_probability(threshold, population, sample_rate) <= allowed:
            return threshold
    return 2


def calibrated_parameters(
    parameters: SkellamParameters,
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    rounds: int,
    population: int,
) -> SkellamParameters:
    """``parameters`` at the smallest σ (to 0.5%, on the budget side) whose ε at δ against the released models'
    consumers after ``rounds`` rounds at rate q over M = ``population`` is at most ``target_epsilon``: the ε a run's
    budget guards, as the ledger composes it. The scale moves with σ (more noise leaves less room below the
    modulus, so a smaller scale and a rounding that weighs more), which is why σ is searched here on the Skellam
    bound itself and not taken from the Gaussian mechanism's calibration."""

    def at(sigma: float) -> SkellamParameters:
        return dataclasses.replace(parameters, noise_multiplier=sigma)

    def epsilon(sigma: float) -> float:
        return DistributedLedger(delta, population, at(sigma)).projected_epsilon(sigma, sample_rate, rounds)

    if rounds < 1 or not 0 < sample_rate <= 1:
        raise ValueError(f"calibration needs rounds >= 1 and q in (0, 1], got {rounds} and {sample_rate}")
    run = f"(distributed Skellam, q = {sample_rate}, T = {rounds})"
    return at(calibrate(epsilon, target_epsilon, at=f"at δ = {delta} {run}", run=run))


def _config(delta: float, population: int, method: SamplingMethod) -> PrivacyConfig:
    return PrivacyConfig(
        target_delta=float(delta),
        population_size=population,
        neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
        sampling_method=method,
    )
