"""Flower's own FedAvg-family strategies as the server step of our rounds: ``server_optimizer=flower_fedadam`` (or
``flower_fedavg``, ``flower_fedavgm``, ``flower_fedadagrad``, ``flower_fedyogi``) under any of our strategies.

Step 6's last move, w ← step(w, Δ̄), is post-processing of the released average Δ̄ (docs/mechanisms.md, 6): it reads
only the release and public hyper-parameters, so it changes utility, never ε. :class:`FlowerServerStep` hands that
move to a Flower strategy built from ``server_optimizer`` and ``strategy.server_lr``: every round Flower's own
``configure_train`` sees the round's global model (FedOpt keeps it as ``current_arrays``; the messages it builds are
not sent — our round samples and sends its own), and its own ``aggregate_train`` averages one reply, w + Δ̄ of unit
weight, and takes its step (FedAvg: the mean itself; FedAvgM: SGD with server momentum; FedAdagrad / FedAdam /
FedYogi: Reddi et al., ICLR 2021, as Flower writes them, e.g. FedAdam's bias correction folded into the step size and
τ outside the corrected root). The result is cast to the model's dtypes. The Flower strategy's state (momentum,
first and second moments) is checkpointed by name, so a resumed run continues its steps exactly.

The same strategies wrapped by :class:`strategies.flower_dp.ClientLevelDP` average every reply this way; here our
round has already made the release, and the Flower strategy sees only that.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAdagrad, FedAdam, FedAvg, FedAvgM, FedYogi

from fl_app.config import AppConfig, ServerOptimizerConfig
from fl_app.core.choices import FLOWER_SERVER_STEPS
from fl_app.server_optimizers import ServerOptimizer
from strategies.flower_dp.checks import UNIT_WEIGHT
from strategies.flower_dp.logs import inner_round_lines_dropped
from strategies.flower_dp.replies import forward

_COMMON: dict[str, Any] = {"min_train_nodes": 1, "min_available_nodes": 1, "weighted_by_key": UNIT_WEIGHT}

#: The Flower strategy each ``server_optimizer.name`` builds, from η = ``strategy.server_lr`` and the section's β₁
#: (``momentum``), β₂ (``beta2``) and τ (``eps``). Each addresses every node, of any number (its messages are not
#: sent), and weights by the unit weight of the one reply it is given.
_BUILDERS: dict[str, Callable[[float, ServerOptimizerConfig], FedAvg]] = {
    "flower_fedavg": lambda lr, o: FedAvg(**_COMMON),
    "flower_fedavgm": lambda lr, o: FedAvgM(**_COMMON, server_learning_rate=lr, server_momentum=o.momentum),
    "flower_fedadagrad": lambda lr, o: FedAdagrad(**_COMMON, eta=lr, tau=o.eps),
    "flower_fedadam": lambda lr, o: FedAdam(**_COMMON, eta=lr, beta_1=o.momentum, beta_2=o.beta2, tau=o.eps),
    "flower_fedyogi": lambda lr, o: FedYogi(**_COMMON, eta=lr, beta_1=o.momentum, beta_2=o.beta2, tau=o.eps),
}

#: The attributes in which Flower's strategies keep their state across rounds (FedAvgM: the momentum vector, a list;
#: FedOpt: the moments, dicts by array key): what a checkpoint stores.
_STATE_ATTRIBUTES = ("momentum_vector", "m_t", "v_t")


class FlowerServerStep:
    """The server step of ``server_optimizer`` taken by the Flower strategy it names (module docstring); the
    interface of :class:`fl_app.server_optimizers.ServerOptimizer` plus :meth:`begin_round`."""

    def __init__(self, config: ServerOptimizerConfig, lr: float) -> None:
        if config.name not in _BUILDERS:
            raise ValueError(f"FlowerServerStep: {config.name!r} is not one of {', '.join(_BUILDERS)}")
        self.name = config.name
        #: The Flower strategy that takes the step.
        self.strategy: FedAvg = _BUILDERS[config.name](float(lr), config)
        self._round: int | None = None
        self._keys: list[str] = []

    def describe(self) -> str:
        """The Flower strategy and its settings, for the run's banner."""
        s = self.strategy
        settings = {k: getattr(s, k) for k in ("eta", "beta_1", "beta_2", "tau", "server_learning_rate",
                                               "server_momentum") if hasattr(s, k)}  # fmt: skip
        return f"{self.name} (Flower's {type(s).__name__}) " + " ".join(f"{k}={v:g}" for k, v in settings.items())

    def begin_round(self, server_round: int, arrays: ArrayRecord, grid: Grid) -> None:
        """Flower's ``configure_train`` for the round's global model ``arrays`` (FedOpt keeps it as the point its
        step starts from); the messages it builds are dropped."""
        with inner_round_lines_dropped():
            list(self.strategy.configure_train(server_round, arrays, ConfigRecord(), grid))
        self._round, self._keys = server_round, list(arrays.keys())

    def step(self, weights: Sequence[np.ndarray], average: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The new weights: Flower's ``aggregate_train`` of one reply w + Δ̄ (float64) of unit weight, cast to each
        tensor's dtype."""
        if self._round is None or len(self._keys) != len(weights):
            raise RuntimeError("FlowerServerStep.step before begin_round of the round's model")
        moved = [
            np.asarray(w, dtype=np.float64) + np.asarray(a, dtype=np.float64)
            for w, a in zip(weights, average, strict=True)
        ]
        reply = forward(self.strategy.arrayrecord_key, tuple(self._keys), moved, None)
        with inner_round_lines_dropped():
            aggregated, _ = self.strategy.aggregate_train(self._round, [reply])
        if aggregated is None:
            raise RuntimeError(f"Flower's {type(self.strategy).__name__} aggregated nothing")
        return [
            np.asarray(aggregated[k].numpy()).astype(np.asarray(w).dtype)
            for k, w in zip(self._keys, weights, strict=True)
        ]

    def state(self) -> tuple[dict[str, Any], dict[str, list[np.ndarray]]]:
        """(scalars, arrays) for a checkpoint: the Flower strategy's state attributes, by array key order."""
        arrays: dict[str, list[np.ndarray]] = {}
        for attribute in _STATE_ATTRIBUTES:
            value = getattr(self.strategy, attribute, None)
            if value:
                values = value.values() if isinstance(value, Mapping) else value
                arrays[f"flower_{attribute}"] = [np.array(v) for v in values]
        return {"flower_keys": list(self._keys)}, arrays

    def load_state(self, state: Mapping[str, Any], arrays: Mapping[str, list[np.ndarray]]) -> None:
        """Restore what :meth:`state` saved (FedOpt's moments are dicts by the stored array keys)."""
        keys = list(state.get("flower_keys", []))
        for attribute in _STATE_ATTRIBUTES:
            stored = arrays.get(f"flower_{attribute}")
            if stored is None or not hasattr(self.strategy, attribute):
                continue
            is_dict = attribute != "momentum_vector"
            setattr(self.strategy, attribute, dict(zip(keys, stored, strict=True)) if is_dict else list(stored))


def server_step(config: AppConfig) -> ServerOptimizer | FlowerServerStep:
    """The run's server step: ``server_optimizer`` with step size ``strategy.server_lr``, ours
    (fl_app/server_optimizers.py) or Flower's strategy of that name."""
    opt, lr = config.server_optimizer, config.strategy.server_lr
    assert lr is not None  # resolved by the config
    if opt.name in FLOWER_SERVER_STEPS:
        return FlowerServerStep(opt, lr)
    return ServerOptimizer(opt.name, lr=lr, momentum=opt.momentum, beta2=opt.beta2, eps=opt.eps)
