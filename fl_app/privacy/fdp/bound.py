"""The result object the server uses each round: :class:`GDPBound`, the μ-GDP bound of Noisy-FedAvg (Thm 3) or
Noisy-FedProx (Thm 4) after T rounds and the (ε, δ)-DP it implies (Lemma 3), made by :func:`noisy_bound`
(Sun et al., seed paper 004). Its description always states the smoothness L as an assumption.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Literal

from fl_app.core.choices import NOISY_SCHEDULES, NoisySchedule
from fl_app.privacy.fdp.checks import _count
from fl_app.privacy.fdp.conversions import gdp_to_epsilon
from fl_app.privacy.fdp.theorems import gdp_mu_noisy_fedavg, gdp_mu_noisy_fedprox

Algorithm = Literal["noisy_fedavg", "noisy_fedprox"]
ALGORITHMS: tuple[str, ...] = ("noisy_fedavg", "noisy_fedprox")

_EQUATION = {
    ("noisy_fedavg", "constant"): "Thm 3(a), Eq. (15)",
    ("noisy_fedavg", "cyclic"): "Thm 3(b), Eq. (16)",
    ("noisy_fedavg", "stagewise"): "Thm 3(c), Eq. (17)",
    ("noisy_fedavg", "continuous"): "Thm 3(d), Eq. (18)",
}
_SCHEDULE_FORM = {
    "constant": "eta = lr",
    "cyclic": "eta = lr/(k+1)",
    "stagewise": "eta = lr/(t+1)",
    "continuous": "eta = lr/(tK+k+1)",
}


@dataclass(frozen=True)
class GDPBound:
    """A μ-GDP bound for Noisy-FedAvg / Noisy-FedProx and the (ε, δ)-DP it implies (Lemma 3).

    ``parameters`` holds the inputs of the bound, including the *assumed* smoothness ``L``.
    """

    algorithm: str
    schedule: str
    parameters: dict[str, float]
    mu: float
    epsilon: float
    delta: float

    def describe(self) -> str:
        """A few human-readable lines; the last states L and that it is an assumption."""
        p = self.parameters
        if self.algorithm == "noisy_fedprox":
            source = "Thm 4, Eq. (19)"
            name = "Noisy-FedProx"
        else:
            source = _EQUATION.get((self.algorithm, self.schedule), "Thm 3")
            name = "Noisy-FedAvg"
        shown = ", ".join(f"{k}={v:g}" for k, v in p.items() if k != "L")
        lines = [
            f"{name} ({self.schedule} schedule, {_SCHEDULE_FORM.get(self.schedule, '?')}), "
            f"Sun et al. {source}: mu-GDP with mu = {self.mu:.6g}",
            f"  => (epsilon, delta)-DP with epsilon = {self.epsilon:.6g} at delta = {self.delta:.3g} (Lemma 3)",
            f"  parameters: {shown}",
            f"  L = {p.get('L', float('nan')):g} (smoothness; an assumption, not measured)",
        ]
        return "\n".join(lines)


def noisy_bound(
    algorithm: Algorithm,
    schedule: NoisySchedule,
    *,
    lr: float,
    V: float,
    K: int,
    m: float,
    sigma: float,
    L: float,
    T: int,
    delta: float,
    alpha: float | None = None,
) -> GDPBound:
    """μ after T rounds (Thm 3 or Thm 4) and the ε it implies at ``delta`` (Lemma 3), as a :class:`GDPBound`.

    ``alpha`` is required for ``noisy_fedprox`` and ignored for ``noisy_fedavg``. For Noisy-FedProx the schedule is
    only recorded: Theorem 4 holds for any non-increasing schedule (Table 2) and its bound does not depend on it,
    the condition lr < 1/(alpha − L) being on the largest step, lr.

    Raises:
        ValueError: unknown algorithm or schedule, a parameter out of range, a missing alpha, or a violated
            condition of Theorem 4.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}; got {algorithm!r}")
    if schedule not in NOISY_SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(NOISY_SCHEDULES)}; got {schedule!r}")
    if not (isinstance(delta, numbers.Real) and 0.0 < float(delta) < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    K_int = _count("K", K)
    T_int = _count("T", T)
    parameters: dict[str, float] = {
        "lr": float(lr),
        "V": float(V),
        "K": K_int,
        "m": float(m),
        "sigma": float(sigma),
        "T": T_int,
    }
    if algorithm == "noisy_fedprox":
        if alpha is None:
            raise ValueError("noisy_fedprox needs alpha (the proximal coefficient, alpha > L)")
        mu = gdp_mu_noisy_fedprox(V=V, m=m, sigma=sigma, L=L, alpha=alpha, T=T_int, lr=lr)
        parameters["alpha"] = float(alpha)
    else:
        mu = gdp_mu_noisy_fedavg(schedule, lr=lr, V=V, K=K_int, m=m, sigma=sigma, L=L, T=T_int)
    parameters["L"] = float(L)
    return GDPBound(
        algorithm=algorithm,
        schedule=schedule,
        parameters=parameters,
        mu=mu,
        epsilon=gdp_to_epsilon(mu, float(delta)),
        delta=float(delta),
    )
