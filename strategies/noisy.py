"""Noisy-FedAvg and Noisy-FedProx with their convergent f-DP bound (seed 004: Eqs. 2 and 4, App. B Alg. 1;
Thms 3 and 4), as defined in docs/algorithms.md ("Definitions of the baselines").

Clients run K local SGD steps with every minibatch gradient clipped to V (FedProx adds α(w − w_t)) and upload
their model plus N(0, σ² I) with an **absolute** σ (``strategy.noise_std``); the server averages the noisy models
uniformly over those that arrived. There is no update clipping and no sampled-Gaussian accountant: the privacy is
the μ-GDP bound of Thm 3 (schedule ``strategy.lr_schedule``) or Thm 4, with m = the expected number of
participating clients (Remark 3.2) and the user-supplied smoothness assumption L (``strategy.smoothness``),
converted to (ε, δ) by Lemma 3. Each round logs μ and ε(δ).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from fl_app.config import StrategyConfig, require
from fl_app.core.choices import NOISY_SCHEDULES
from fl_app.instructions import NoisyLocalConfig, RecipeSpec
from fl_app.privacy.fdp import GDPBound, noisy_bound
from fl_app.privacy.ledger import GDPLedger, PrivacyLedger
from strategies.own_mechanism import PrivateByItsOwnMechanism


@dataclass(frozen=True)
class NoisyConfig(StrategyConfig):
    """Noisy-FedAvg (seed 004): K local steps, the schedule's constant μ and the schedule, per-step gradient clip V,
    absolute noise std σ on the uploaded model, the assumed smoothness L."""

    local_steps: int = 10
    noisy_lr: float = 0.05
    lr_schedule: str = "constant"
    grad_clip: float = 1.0
    noise_std: float = 0.01
    smoothness: float = 1.0

    def check(self) -> None:
        super().check()
        require(self.noisy_lr > 0, "strategy.noisy_lr", self.noisy_lr, "> 0")
        require(self.lr_schedule in NOISY_SCHEDULES, "strategy.lr_schedule", self.lr_schedule,
                " | ".join(NOISY_SCHEDULES))  # fmt: skip
        require(self.grad_clip > 0, "strategy.grad_clip", self.grad_clip, "V > 0")
        require(self.noise_std >= 0, "strategy.noise_std", self.noise_std, "sigma >= 0")
        require(self.smoothness > 0, "strategy.smoothness", self.smoothness, "L > 0")


@dataclass(frozen=True)
class NoisyProxConfig(NoisyConfig):
    """Noisy-FedProx: Noisy-FedAvg plus the proximal coefficient α."""

    prox_coef: float = 0.0

    def check(self) -> None:
        super().check()
        require(self.prox_coef >= 0, "strategy.prox_coef", self.prox_coef, "alpha >= 0")


class NoisyFedAvg(PrivateByItsOwnMechanism):
    config_name = "noisy_fedavg"
    settings_class: ClassVar[type[StrategyConfig]] = NoisyConfig
    local_optimizer = "sgd"
    supports_noisy_statistics = False  # the GDP bound of seed 004 has no room for another release
    audit_refusal = (
        "Noisy-FedAvg/FedProx release noisy models with absolute noise on the whole model and no update clip; a "
        "canary has no norm C to be held to and its ε is a GDP bound over local steps, not a per-round mechanism"
    )
    adaptive_clipping_refusal = (
        "Noisy-FedAvg/FedProx clip per-step gradients (strategy.grad_clip) and add absolute noise to the model; "
        "there is no update clip norm C for adaptive clipping to move"
    )
    algorithm: ClassVar[str] = "noisy_fedavg"
    clips_updates = False  # each local gradient is clipped to V instead
    own_bound = "the GDP bound of seed 004 (Thm 3 / Thm 4) of the number of releases"
    server_average = False  # the clients noise their models; the server takes the plain mean of what arrived

    @property
    def prox_coef(self) -> float:
        return 0.0

    def bound(self, rounds: int) -> GDPBound:
        s = self.config.strategy
        return noisy_bound(
            self.algorithm,
            s.lr_schedule,
            lr=s.noisy_lr,
            V=s.grad_clip,
            K=s.local_steps,
            m=max(1, round(self.expected_clients)),
            sigma=s.noise_std,
            L=s.smoothness,
            T=max(rounds, 1),
            delta=self.config.privacy.delta,
            alpha=self.prox_coef or None,
        )

    # --- privacy reporting -------------------------------------------------------------------------------------

    def make_ledger(self) -> PrivacyLedger:
        """The GDP bound of seed 004 replaces the sampled-Gaussian accountant: T releases of the same mechanism."""
        s = self.config.strategy
        source = "Thm 4" if self.prox_coef else f"Thm 3, {s.lr_schedule}"
        return GDPLedger(
            self.config.privacy.delta, self.bound, lambda: f"seed 004 {source}; assumes L = {s.smoothness}"
        )

    def round_extras(self) -> dict[str, Any]:
        assert self.account is not None and isinstance(self.account.ledger, GDPLedger)
        return {"gdp_mu": self.account.ledger.mu}

    def not_covered_reason(self) -> str | None:
        if self.prox_coef or self.config.strategy.lr_schedule in ("constant", "cyclic"):
            return (
                "seed 004's convergent bound (Thm 3a/3b, Thm 4) needs interpolation weights lambda > 1 that its own "
                "Eq. 9 / Lemma 6 exclude (App. G.3); its mu is reported, not verified (stagewise/continuous are not "
                "affected)"
            )
        return None

    def mechanism_claim(self) -> dict[str, Any]:
        s = self.config.strategy
        return {
            "noise_std": s.noise_std,
            "grad_clip": s.grad_clip,
            "local_steps": s.local_steps,
            "smoothness_assumed": s.smoothness,
        }

    # --- client recipe and aggregation ------------------------------------------------------------------------

    def client_recipe(self) -> RecipeSpec:
        return RecipeSpec(kind="noisy_model", noise_std=self.config.strategy.noise_std)

    def local_training(self) -> NoisyLocalConfig:
        s = self.config.strategy
        return NoisyLocalConfig(
            steps=s.local_steps,
            batch_size=self.config.client.batch_size,
            lr=s.noisy_lr,
            schedule=s.lr_schedule,  # type: ignore[arg-type]
            grad_clip=s.grad_clip,
            prox_coef=self.prox_coef,
        )


class NoisyFedProx(NoisyFedAvg):
    config_name = "noisy_fedprox"
    settings_class = NoisyProxConfig
    algorithm = "noisy_fedprox"

    @property
    def prox_coef(self) -> float:
        return self.config.strategy.prox_coef
