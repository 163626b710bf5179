"""DP-FTRL-FedAvg and DP-FTRL-FedSAM: client-level DP from correlated noise under an enforced participation rule,
with no amplification by sampling (Kairouz et al. 2021; Xu et al. 2023, arXiv 2305.18465, Gboard; BandMF,
Choquette-Choo et al. 2023, arXiv 2306.08153; BLT, Dvijotham et al. 2024, arXiv 2404.16706, and McMahan, Xu, Zhang
2024, arXiv 2408.08868).

The declarations of the strategies over the round skeleton (strategies/base.py):

* **sampling** — ``privacy.sampling=cyclic`` (b groups of a secret-free random order taken in turn: each client
  every b rounds) or ``available`` (up to m of the clients available now, in deployment the connected SuperNodes'
  clients); either way the server's participation record refuses a client that took part fewer than b rounds ago or
  k times already, and is checkpointed (the run's sampler: strategies/client_dp/sampling.py).
* **clients** clip Δ to C (recipe ``clip``); **the server** adds round t's row of σ·C⁻¹z (in units of C/m) to the
  fixed-denominator average (:class:`fl_app.privacy.correlated_noise.CorrelatedNoise`), and its optimizer is the
  workload the factorization was optimised for: ``server_optimizer=sgd`` (prefix sums) or ``momentum`` (β).
* **accounting** — the GDP ledger over the factorization's bound after T rows: μ = sens_Π(C_T)/σ, ε(δ), ρ = μ²/2
  (fl_app/privacy/accountants/matrix_factorization.py); ``privacy.target_epsilon`` calibrates σ by it.

Refused, with the reason: client placement (the stream spans rounds no client holds), adaptive clipping and noisy
client statistics (their counts would need a joint accounting with the factorization that is not done here), the
adaptive server optimizers (not a linear workload), and a resume that would re-release a round drawn from the CSPRNG
(the same row twice with fresh noise is outside the factorization).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from logging import INFO
from typing import Any, ClassVar

from flwr.common.logger import log

from fl_app.config import ConfigError, StrategyConfig, require
from fl_app.core.choices import FACTORIZATIONS, PARTICIPATION_SAMPLINGS
from fl_app.instructions import RecipeSpec
from fl_app.privacy.accountants.matrix_factorization import (
    MatrixFactorizationBound,
    calibrate_matrix_factorization,
    matrix_factorization_bound,
)
from fl_app.privacy.correlated_noise import CorrelatedNoise, Factorization
from fl_app.privacy.ledger import GDPLedger, PrivacyLedger
from fl_app.privacy.mechanisms.participation import (
    ParticipationRule,
)
from fl_app.privacy.pipeline import Mechanism
from strategies.client_dp.sampling import ParticipationSampler
from strategies.own_mechanism import PrivateByItsOwnMechanism


@dataclass(frozen=True)
class FTRLConfig(StrategyConfig):
    """DP-FTRL: the factorization (blt | banded | identity), the BLT's buffers, the banded one's bands (null = b)."""

    factorization: str = "blt"
    buffers: int = 3
    bands: int | None = None

    def check(self) -> None:
        super().check()
        require(self.factorization in FACTORIZATIONS, "strategy.factorization", self.factorization,
                " | ".join(FACTORIZATIONS))  # fmt: skip
        require(isinstance(self.buffers, int) and 1 <= self.buffers <= 8, "strategy.buffers", self.buffers,
                "an integer in [1, 8]")  # fmt: skip
        require(self.bands is None or (isinstance(self.bands, int) and self.bands >= 1), "strategy.bands",
                self.bands, "an integer >= 1 or null for min_separation")  # fmt: skip


class DPFTRLFedAvg(PrivateByItsOwnMechanism):
    config_name = "dp_ftrl_fedavg"
    settings_class: ClassVar[type[StrategyConfig]] = FTRLConfig
    local_optimizer = "sgd"
    samplings = PARTICIPATION_SAMPLINGS
    supports_noisy_statistics = False
    adaptive_clipping_refusal = (
        "DP-FTRL's bound is one Gaussian mechanism of the factorization at one clip norm; adaptive clipping's noisy "
        "count every round would need a joint accounting with it that is not done here"
    )
    own_bound = (
        "the matrix-factorization mechanism's GDP bound over the run (one Gaussian mechanism of the factorization's "
        "sensitivity)"
    )
    client_placement_refusal = (
        "DP-FTRL's noise is one stream correlated across rounds (C^-1 z); a client takes part in at most k rounds "
        "and cannot hold it, so the server adds it"
    )

    # ----- participation: the run's sampler (strategies/client_dp/sampling.py: ParticipationSampler) -----------

    @property
    def participation_sampler(self) -> ParticipationSampler:
        """``privacy.sampling``'s sampler (cyclic or available), which enforces and records the participation rule."""
        assert isinstance(self.sampler, ParticipationSampler)  # the config admits only PARTICIPATION_SAMPLINGS
        return self.sampler

    @property
    def rule(self) -> ParticipationRule:
        """The participation rule the accounting rests on and the server enforces (b, k from ``privacy``)."""
        return self.participation_sampler.rule

    # ----- the factorization and its accounting ----------------------------------------------------------------

    @cached_property
    def workload_momentum(self) -> float:
        """β of the workload the server optimizer applies: 0 for SGD (prefix sums), β for heavy-ball momentum."""
        opt = self.config.server_optimizer
        if opt.name == "sgd":
            return 0.0
        if opt.name == "momentum":
            return float(opt.momentum)
        raise ConfigError(
            f"invalid config value server_optimizer.name={opt.name}: DP-FTRL needs sgd or momentum (the linear "
            "workload its factorization is optimised for); adagrad/adam/yogi are not linear in the released noise, "
            "and Flower's steps (flower_*) are not the workload it was optimised for"
        )

    @cached_property
    def factorization(self) -> Factorization:
        """The factorization optimised for this run; a combination it cannot be built for is refused naming the
        settings that decide it."""
        s = self.config.strategy
        try:
            return Factorization.optimized(
                s.factorization,
                self.config.num_rounds,
                self.rule,
                buffers=s.buffers,
                bands=s.bands,
                momentum=self.workload_momentum,
            )
        except ValueError as exc:
            raise ConfigError(
                f"invalid DP-FTRL configuration strategy.factorization={s.factorization} strategy.buffers={s.buffers} "
                f"strategy.bands={s.bands} num_rounds={self.config.num_rounds} privacy.min_separation="
                f"{self.rule.min_separation} privacy.max_participations={self.rule.max_participations}: {exc}"
            ) from exc

    def privacy_bound(self, rounds: int) -> MatrixFactorizationBound:
        """The factorization's privacy after its first ``rounds`` rows (μ, ε at δ, ρ) at the run's σ."""
        return matrix_factorization_bound(
            self.factorization.toeplitz,
            self.config.num_rounds,
            max(rounds, 1),
            self.rule.min_separation,
            self.rule.max_participations,
            self.noise_multiplier,
            self.config.privacy.delta,
            factorization=self.factorization.name,
        )

    def make_ledger(self) -> PrivacyLedger:
        self.workload_momentum  # noqa: B018 -- refuses a non-linear server optimizer before anything else
        return GDPLedger(
            self.config.privacy.delta,
            self.privacy_bound,  # type: ignore[arg-type]
            lambda: f"matrix factorization, {self.factorization.describe()}; {self.rule.describe()}",
            population=self.num_clients,
            label="gdp (matrix factorization under the participation rule)",
        )

    def calibrated_noise_multiplier(self) -> float:
        p = self.config.privacy
        if p.target_epsilon is None:
            return p.noise_multiplier
        sigma = calibrate_matrix_factorization(
            p.target_epsilon,
            p.delta,
            self.factorization.toeplitz,
            self.config.num_rounds,
            self.rule.min_separation,
            self.rule.max_participations,
        )
        log(INFO, "Calibrated noise multiplier sigma=%.4f for target epsilon=%.3f (delta=%.3g, T=%d, %s; %s)",
            sigma, p.target_epsilon, p.delta, self.config.num_rounds, self.factorization.describe(),
            self.rule.describe())  # fmt: skip
        return sigma

    def client_recipe(self) -> RecipeSpec:
        return RecipeSpec(kind="clip")

    def server_mechanisms(self) -> tuple[Mechanism, ...]:
        return (CorrelatedNoise(self.factorization),)

    def round_extras(self) -> dict[str, Any]:
        assert self.account is not None and isinstance(self.account.ledger, GDPLedger)
        mu = self.account.ledger.mu
        refused = self.participation_sampler.refused_last_round
        return {"gdp_mu": mu, "zcdp_rho": mu * mu / 2, "participation_refused": refused}

    def mechanism_claim(self) -> dict[str, Any]:
        rounds = 0 if self.account is None else self.account.ledger.rounds
        bound = self.privacy_bound(max(rounds, 1))
        return {
            **({} if self.account is None else self.account.mechanism()),
            "sampling": self.config.privacy.sampling,
            "participation_rule": self.rule.describe(),
            "min_separation": self.rule.min_separation,
            "max_participations": self.rule.max_participations,
            "amplification": "none (the epsilon holds for every participation pattern the rule allows)",
            "factorization": {**self.factorization.to_dict(), "describe": self.factorization.describe()},
            "sensitivity": bound.sensitivity,
            "zcdp_rho": bound.rho if rounds else 0.0,
            "adjacency": "zero-out (a client's updates replaced by zeros; each participation moves its round's "
            "average by at most C/m)",
        }

    def summary(self) -> None:
        super().summary()
        bound = self.privacy_bound(self.config.num_rounds)
        log(INFO, "\tDP-FTRL: %s; participation rule: %s (%s sampler, enforced by the server; no amplification)",
            self.factorization.describe(), self.rule.describe(), self.config.privacy.sampling)  # fmt: skip
        log(INFO, "\tafter %d rounds: sensitivity %.4g, mu=%.4g-GDP => (%.4g, %.3g)-DP, rho=%.4g-zCDP",
            self.config.num_rounds, bound.sensitivity, bound.mu, bound.epsilon, bound.delta, bound.rho)  # fmt: skip


class DPFTRLFedSAM(DPFTRLFedAvg):
    """DP-FTRL with SAM (or ASAM) local training: flatter local models under the same correlated noise."""

    config_name = "dp_ftrl_fedsam"
    local_optimizer = "sam"


class DPFedAvgUnamplified(DPFTRLFedAvg):
    """DP-FedAvg as a deployment can honestly claim it: DP-FedAvg's independent noise (the identity factorization, its
    config's default) accounted with no amplification, as k Gaussian releases under the enforced rule."""

    config_name = "dp_fedavg_unamplified"
