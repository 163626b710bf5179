"""Server optimizers: how the global model moves along the round's released average (FedOpt; Reddi et al.,
"Adaptive Federated Optimization", ICLR 2021, Algorithm 2).

The round's average Δ_t (for a DP strategy: the noisy, fixed-denominator average the ledger accounts) is the
negative of a pseudo-gradient, g_t = −Δ_t, and the server takes one optimizer step on it. The step reads only
released values and public hyper-parameters, so it is post-processing of the mechanism's output: it changes
utility, never ε. Nothing here knows about privacy or federation; the strategy hands every step the global weights
and the average.

Each rule is the update PyTorch's optimizer applies for gradient g = −Δ (``tests/strategies/test_server_optimizers.py``
checks each against ``torch.optim`` or, for Yogi, a plain-torch step), with η = ``strategy.server_lr``, β₁ =
``server_optimizer.momentum``, β₂ = ``server_optimizer.beta2``, τ = ``server_optimizer.eps``:

- ``sgd``:      w ← w + η·Δ (FedAvg's server step with server learning rate η);
- ``momentum``: b ← β₁·b + Δ;  w ← w + η·b (``torch.optim.SGD(momentum=β₁)``; FedAvgM, Hsu et al. 2019);
- ``adagrad``:  v ← v + Δ²;  w ← w + η·Δ / (√v + τ) (``torch.optim.Adagrad(eps=τ)``; FedAdagrad);
- ``adam``:     m ← β₁m + (1−β₁)Δ;  v ← β₂v + (1−β₂)Δ²;  w ← w + η·m̂ / (√v̂ + τ) with the bias corrections
                m̂ = m/(1−β₁ᵗ), v̂ = v/(1−β₂ᵗ) (``torch.optim.Adam(eps=τ)``; FedAdam);
- ``yogi``:     as adam with v ← v − (1−β₂)·Δ²·sign(v − Δ²) (Zaheer et al. 2018; FedYogi).

The optimizers' state (b, m, v, t) is float64 and goes into checkpoints, so a resumed run continues exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fl_app.core.choices import SERVER_OPTIMIZERS

#: The accepted values of ``server_optimizer.name`` (fl_app/config/server_optimizer.py validates against this list).


class ServerOptimizer:
    """One of :data:`SERVER_OPTIMIZERS` over a list of weight tensors."""

    def __init__(
        self, name: str = "sgd", lr: float = 1.0, momentum: float = 0.9, beta2: float = 0.99, eps: float = 1e-3
    ) -> None:
        if name not in SERVER_OPTIMIZERS:
            raise ValueError(f"unknown server optimizer {name!r}: one of {', '.join(SERVER_OPTIMIZERS)}")
        self.name, self.lr, self.momentum, self.beta2, self.eps = name, float(lr), float(momentum), float(beta2), eps
        self.steps = 0
        self._first: list[np.ndarray] = []  # b (momentum) or m (adam, yogi)
        self._second: list[np.ndarray] = []  # v (adagrad, adam, yogi)

    def describe(self) -> str:
        """The optimizer and the settings its step uses, for the run's banner."""
        parts = [f"{self.name} lr={self.lr:g}"]
        if self.name in ("momentum", "adam", "yogi"):
            parts.append(f"beta1={self.momentum:g}")
        if self.name in ("adam", "yogi"):
            parts.append(f"beta2={self.beta2:g}")
        if self.name in ("adagrad", "adam", "yogi"):
            parts.append(f"tau={self.eps:g}")
        return " ".join(parts)

    def begin_round(self, server_round: int, arrays: object, grid: object) -> None:
        """Nothing: the step needs only the weights and the average (Flower's steps need the round's model first:
        strategies/flower_step.py)."""

    def step(self, weights: Sequence[np.ndarray], average: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The new weights after one step along ``average`` (Δ_t); each tensor keeps its dtype."""
        self.steps += 1
        if self.name == "sgd":
            # Exactly the server step of every strategy before server optimizers existed (bit for bit): w + η·Δ in
            # float64, rounded to w's dtype. The ufuncs widen their inputs exactly and round as they write, so no
            # float64 copy of the model is made (and η = 1 multiplies nothing: 1·x = x for every float).
            moves = average if self.lr == 1.0 else [np.multiply(a, self.lr, dtype=np.float64) for a in average]
            return [_add_rounded(w, move) for w, move in zip(weights, moves, strict=True)]
        delta = [np.asarray(a, dtype=np.float64) for a in average]
        if not self._first and not self._second:
            self._first = [np.zeros_like(d) for d in delta]
            self._second = [np.zeros_like(d) for d in delta]
        beta1, beta2 = self.momentum, self.beta2
        moves = []
        for i, d in enumerate(delta):
            if self.name == "momentum":
                self._first[i] = beta1 * self._first[i] + d
                moves.append(self._first[i])
                continue
            square = d * d
            if self.name == "adagrad":
                self._second[i] = self._second[i] + square
                moves.append(d / (np.sqrt(self._second[i]) + self.eps))
                continue
            self._first[i] = beta1 * self._first[i] + (1 - beta1) * d
            if self.name == "adam":
                self._second[i] = beta2 * self._second[i] + (1 - beta2) * square
            else:  # yogi: v moves towards Δ² additively, by (1 - β₂)Δ² at most
                self._second[i] = self._second[i] - (1 - beta2) * square * np.sign(self._second[i] - square)
            first = self._first[i] / (1 - beta1**self.steps)
            second = self._second[i] / (1 - beta2**self.steps)
            moves.append(first / (np.sqrt(second) + self.eps))
        return [_add_rounded(w, self.lr * move) for w, move in zip(weights, moves, strict=True)]

    def state(self) -> tuple[dict[str, Any], dict[str, list[np.ndarray]]]:
        """(scalars, arrays) for a checkpoint."""
        return {"server_optimizer_steps": self.steps}, {
            "server_optimizer_first": list(self._first),
            "server_optimizer_second": list(self._second),
        }

    def load_state(self, state: Mapping[str, Any], arrays: Mapping[str, list[np.ndarray]]) -> None:
        self.steps = int(state.get("server_optimizer_steps", 0))
        self._first = [np.asarray(a, dtype=np.float64) for a in arrays.get("server_optimizer_first", [])]
        self._second = [np.asarray(a, dtype=np.float64) for a in arrays.get("server_optimizer_second", [])]


def _add_rounded(weights: np.ndarray, move: np.ndarray) -> np.ndarray:
    """``(weights.astype(float64) + move).astype(weights.dtype)``, computed in float64 and rounded as it is written."""
    w = np.asarray(weights)
    return np.add(w, move, out=np.empty(w.shape, w.dtype), dtype=np.float64, casting="unsafe")
