"""What ClientLevelDP accepts: the inner strategies whose aggregate is an unweighted mean of the replies (and the
unit weight that makes it one), and its own arguments — the privacy ones by the rules our strategies' ``privacy``
config is validated by (:func:`fl_app.config.privacy._validate_privacy`, called here, not restated) — all refused
before the first message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from flwr.serverapp.strategy import FedAdagrad, FedAdam, FedAvg, FedAvgM, FedProx, FedYogi
from flwr.serverapp.strategy.fedopt import FedOpt
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from fl_app.config import ConfigError, DPConfig
from fl_app.config.privacy import _validate_privacy
from fl_app.core.choices import AMPLIFIED_SAMPLINGS
from fl_app.instructions import STREAM_SAMPLING, STREAM_SERVER_NOISE

#: The MetricRecord key the inner strategy must weight by (``FedAvg(weighted_by_key=UNIT_WEIGHT)``): the wrapper
#: sets it to 1 in every reply it forwards, so the inner strategy's weighted mean is the unweighted one.
UNIT_WEIGHT = "dp-unit-weight"

#: Purpose keys of the seeded streams (``secure=False``), our strategies' (fl_app/instructions.py): the k-th round
#: the wrapper starts (:attr:`ClientLevelDP.rounds_started`; the server round under one ``Strategy.start``) samples
#: from (seed, k, SAMPLING_STREAM) and draws its noise from (seed, k, NOISE_STREAM)
#: (:func:`fl_app.privacy.mechanisms.random_source`), as round k of our strategies does with
#: ``privacy.noise_stream=shared``. Keyed by k, not by the server round: a second ``start()`` on the same wrapper
#: counts its rounds from 1 again, and a round keyed by the server round would release a second model with an
#: already released noise draw.
SAMPLING_STREAM = STREAM_SAMPLING
NOISE_STREAM = STREAM_SERVER_NOISE

#: Flower strategies whose ``aggregate_train`` is FedAvg's mean of the replies' arrays (weighted by
#: ``weighted_by_key``), possibly followed by a server step that uses only that mean and the strategy's own state:
#: FedAvg; FedOpt (FedAvg's aggregate_train); FedAdam / FedYogi / FedAdagrad (``super().aggregate_train`` then an
#: adaptive step on mean − current); FedAvgM (``super().aggregate_train`` then SGD with momentum on current − mean);
#: FedProx (FedAvg's aggregate_train; only its configure_train adds ``proximal-mu``). Checked in flwr 1.42's source.
MEAN_AGGREGATORS: tuple[type[FedAvg], ...] = (FedAvg, FedOpt, FedAdam, FedYogi, FedAdagrad, FedAvgM, FedProx)

#: The methods through which those strategies aggregate: a subclass that overrides one of them is not known to
#: aggregate by the mean, so it is refused.
_AGGREGATION_METHODS = ("aggregate_train", "_check_and_log_replies", "_compute_deltat_and_mt")


def check_inner_strategy(strategy: object, num_clients: int) -> None:
    """Raise ValueError unless ``strategy`` aggregates by FedAvg's mean with unit weights and lets the wrapper
    sample (see :class:`ClientLevelDP`)."""
    name = type(strategy).__name__
    allowed = ", ".join(cls.__name__ for cls in MEAN_AGGREGATORS)
    if not isinstance(strategy, FedAvg):
        raise ValueError(
            f"ClientLevelDP wraps a FedAvg-family strategy ({allowed}), got {name}: the noise is calibrated to the "
            "sensitivity C/m of a mean of the replies, and the aggregate of this strategy is not known to be one"
        )
    base = next(cls for cls in type(strategy).__mro__ if cls in MEAN_AGGREGATORS)
    for method in _AGGREGATION_METHODS:
        own = method in vars(strategy)  # a method replaced on the instance
        if own or getattr(type(strategy), method, None) is not getattr(base, method, None):
            raise ValueError(
                f"{name} aggregates with its own {method} (inherited from {base.__name__} otherwise), which is not "
                "FedAvg's unweighted mean of the replies: the noise is calibrated to the mean's sensitivity C/m, and "
                "the wrapper's one noise draw passes through a mean unchanged; a median, trimmed mean, Krum/Bulyan "
                f"selection or q-FFL reweighting has neither property. Wrap one of {allowed} (or a subclass that "
                "does not override their aggregation)"
            )
    if strategy.weighted_by_key != UNIT_WEIGHT:
        raise ValueError(
            f"{name}(weighted_by_key={strategy.weighted_by_key!r}) weights each reply by its "
            f"{strategy.weighted_by_key!r} metric: one client with n_i examples then moves the mean by up to "
            "C*n_i/sum(n), not C/m, which multiplies the sensitivity the noise is calibrated to. Build it with "
            f"weighted_by_key=UNIT_WEIGHT ({UNIT_WEIGHT!r}, strategies.flower_dp.UNIT_WEIGHT): the wrapper sets that "
            "key to 1 in every reply it forwards, so the mean is unweighted"
        )
    if strategy.train_metrics_aggr_fn is not aggregate_metricrecords:
        raise ValueError(
            f"{name} has a custom train_metrics_aggr_fn: it would receive each forwarded reply, whose arrays differ "
            "from each other without noise (w + (n/m)·clip(Δ_i) + Z, the same Z on all); use the default (the "
            "wrapper publishes only non-client-derived training metrics)"
        )
    if strategy.fraction_train != 1.0:
        raise ValueError(
            f"{name}(fraction_train={strategy.fraction_train}) samples nodes itself (random.sample, not secret, not "
            "the accounted Poisson/fixed-size sampling); ClientLevelDP samples the round's clients, so the inner "
            "strategy must address all of them: pass fraction_train=1.0"
        )
    for setting in ("min_train_nodes", "min_available_nodes"):
        value = getattr(strategy, setting)
        if value > num_clients:
            raise ValueError(
                f"{name}({setting}={value}) exceeds num_clients={num_clients}: it would wait for nodes that are not "
                f"the population; pass {setting} <= {num_clients}"
            )


def check_arguments(
    num_clients: object,
    sample_rate: object,
    clip_norm: object,
    noise_multiplier: object,
    delta: object,
    sampling: object,
    accountant: object,
    max_epsilon: object,
    secure: object,
    seed: object,
) -> DPConfig:
    """The wrapper's arguments, validated: num_clients, secure and seed here (our strategies take them from other
    config sections); the privacy ones by the ``privacy`` config's own validator, so they follow our strategies'
    rules exactly (σ = 0 is accepted, ε is then ∞; ``delta=None`` is 1/M; ``sampling="auto"`` is Poisson;
    ``sampling="fixed"`` needs a whole q·M and, by name, the ``rdp`` accountant). An ``accountant`` that is not a
    name is judged by the ledger it is given to (:class:`fl_app.privacy.ledger.SampledGaussianLedger`), as our
    strategies' constructor does. Raises :class:`~fl_app.config.ConfigError` (a ValueError) naming the argument."""
    if not _integer(num_clients) or num_clients < 1:  # type: ignore[operator]
        raise ConfigError(f"ClientLevelDP argument num_clients={num_clients!r}: allowed a positive int (M)")
    if not isinstance(secure, (bool, np.bool_)):
        raise ConfigError(f"ClientLevelDP argument secure={secure!r}: allowed True or False")
    if not _integer(seed) or seed < 0:  # type: ignore[operator]
        raise ConfigError(f"ClientLevelDP argument seed={seed!r}: allowed a non-negative int")
    section = {
        "clip_norm": _plain(clip_norm),
        "noise_multiplier": _plain(noise_multiplier),
        "sample_rate": _plain(sample_rate),
        "sampling": sampling,
        # A Flower accountant instance says its sampling itself (the ledger checks it against ``sampling``).
        "accountant": accountant if isinstance(accountant, str) else "rdp",
        "delta": _plain(delta),
        "max_epsilon": _plain(max_epsilon),
        "placement": "server",
        "secure_noise": bool(secure),
        "client_statistics": "none",
    }
    try:
        return _validate_privacy(section, int(num_clients), samplings=AMPLIFIED_SAMPLINGS, strategy="ClientLevelDP")
    except ConfigError as exc:  # the config's message names privacy.<key>: the argument has the key's name
        raise ConfigError(str(exc).replace("invalid config value privacy.", "ClientLevelDP argument ", 1)) from None


def _integer(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python number the config's readers take (np.float32(0.5) -> 0.5); others unchanged."""
    if isinstance(value, (np.integer, np.floating)) and not isinstance(value, np.bool_):
        return value.item()
    return value


def check_release_dir(directory: Path, releases: int, secure: bool) -> None:
    """ValueError for a seeded run on a ``release_dir`` that already logs ``releases`` releases."""
    if releases and not secure:
        raise ValueError(
            f"release_dir {directory} already logs {releases} releases: a seeded run would draw their noise "
            "again (two models whose difference is noise-free, which no accountant covers); use an empty "
            "release_dir, or secure=True"
        )
