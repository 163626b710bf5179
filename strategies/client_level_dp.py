"""Client-level (ε, δ)-DP as one layer around a plain strategy (DP-FedAvg: McMahan, Ramage, Talwar, Zhang, ICLR 2018;
DP-FedSAM: Shi et al., CVPR 2023, journal Alg. 1 with Eqs. 10–11; docs/mechanisms.md states the mechanism).

``ClientLevelDP(strategy, ...)`` is a Flower strategy that wraps ``strategy``, as Flower's own
``DifferentialPrivacyServerSideFixedClipping`` wraps one, and is built for the kind of strategy it is given:

- one of this project's plain strategies (``FederatedAveraging``, ``FedSAM``, the sparsified and BLUR algorithms;
  :class:`strategies.base.FederatedStrategy`): :class:`DPOverRounds`. The strategy's rounds are rebuilt with
  :class:`~strategies.client_dp.private_rounds.PrivateRounds` (clip to C_t, the average over the fixed m with the
  placement's Gaussian noise, the budget guard, the release log, the ledger); its algorithm (the local recipe, the
  round's mask, the server step) is the plain strategy's, untouched.
- one of Flower's FedAvg family: :class:`strategies.dp_over_flower.DPOverFlowerMean`, which obtains the same
  release through the inner strategy's own unweighted mean.

The project's named DP strategies are this layer over their algorithm: ``strategy=dp_fedsam`` builds
``DPFedSAM``, which is ``ClientLevelDP`` over ``FedSAM`` (:class:`RegisteredDP`), and equals
``ClientLevelDP(FedSAM(config))`` bit for bit (tests/strategies/test_client_level_dp.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any, ClassVar

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid, PrivacyAccountant
from flwr.serverapp.strategy import Strategy

from fl_app.config import AppConfig, DPConfig, compose_config, settings_overrides, validate
from fl_app.privacy.ledger import PrivacyLedger
from strategies.base import FederatedStrategy
from strategies.client_dp.account import PrivacyAccount
from strategies.client_dp.private_rounds import PrivateRounds

#: The constructor keywords of a run beyond its config (:attr:`FederatedStrategy.run_arguments`).
RUN_ARGUMENTS = ("metrics", "checkpoint_dir", "resume_from", "on_accounted", "observers")
#: What a named DP strategy takes from its algorithm: what the config checks of it (strategies/registry.py).
ALGORITHM_RULES = (
    "settings_class", "samplings", "audit_refusal", "adaptive_clipping_refusal", "client_placement_refusal",
    "distributed_placement_refusal",
    "local_optimizer",
)  # fmt: skip


class ClientLevelDP(Strategy):
    """Client-level DP around ``strategy``: ``ClientLevelDP(FedSAM(...), clip_norm=0.2, noise_multiplier=0.95)`` or
    ``ClientLevelDP(flwr FedAdam(...), num_clients=..., ...)``; the instance is the subclass for that kind of
    strategy (:meth:`wraps`), and that subclass states its arguments. TypeError for a strategy no subclass wraps;
    ValueError for one it refuses (private already, or not a mean). The layer is not its strategy:
    ``isinstance(DPFedSAM(...), FedSAM)`` is False, ``DPFedSAM(...).strategy`` is the FedSAM it runs."""

    def __new__(cls, *args: Any, **kwargs: Any) -> ClientLevelDP:
        kinds = _kinds()
        if cls is ClientLevelDP:
            strategy = args[0] if args else kwargs.get("strategy")
            if isinstance(strategy, ClientLevelDP):
                raise ValueError(f"ClientLevelDP: {strategy!r} is client-level DP already; wrap its plain strategy")
            wrapping = [kind for kind in kinds if kind.wraps(strategy)]
            if len(wrapping) > 1:
                names = ", ".join(kind.__name__ for kind in wrapping)
                raise TypeError(
                    f"ClientLevelDP: more than one kind of the layer wraps {type(strategy).__name__}: {names}"
                )
            if not wrapping:
                raise TypeError(
                    f"ClientLevelDP wraps one of this project's plain strategies (FederatedAveraging, FedSAM, ...) or "
                    f"one of Flower's FedAvg family, not {type(strategy).__name__}"
                )
            cls = wrapping[0]
        elif not issubclass(cls, tuple(kinds)):
            raise TypeError(
                f"{cls.__name__} subclasses ClientLevelDP, whose instance is the layer for the kind of strategy it "
                "wraps: subclass DPOverRounds (this project's strategies) or DPOverFlowerMean (Flower's FedAvg family)"
            )
        return super().__new__(cls)

    @classmethod
    def wraps(cls, strategy: object) -> bool:
        """Whether this subclass is the layer for ``strategy``."""
        return False

    # ----- what the releases spent, the same for both kinds: the layer's account (client_dp/account.py) ----------

    #: What the layer's releases spent and what ``run.json`` states of it (each kind has one).
    account: PrivacyAccount

    @property
    def accountant(self) -> PrivacyAccountant:
        """What accounts the releases, with Flower's ``PrivacyAccountant`` interface (``compose``, ``get_epsilon``,
        ``would_exceed``, ``state_dict``): the one ``accountant=`` named, or the instance it was given."""
        return self.account.accountant

    @property
    def ledger(self) -> PrivacyLedger:
        """What the releases have spent, one privacy event per release."""
        return self.account.ledger

    @property
    def rounds_released(self) -> int:
        """Noisy models released and accounted (those of the run a resume continues, or logged earlier, included)."""
        return self.account.rounds_released

    def epsilon(self) -> float:
        """ε spent so far at δ (∞ once a release without noise, σ = 0, is accounted)."""
        return self.account.epsilon()


def _kinds() -> list[type[ClientLevelDP]]:
    """The layer's kinds: the direct subclasses of :class:`ClientLevelDP` that say which strategies they wrap."""
    return [kind for kind in ClientLevelDP.__subclasses__() if "wraps" in kind.__dict__]


class DPOverRounds(ClientLevelDP):
    """Client-level DP around one of this project's plain strategies: the strategy rebuilt with
    :class:`PrivateRounds` (its config, with the ``privacy`` settings given here, and its run arguments), whose
    every round is then the mechanism of docs/mechanisms.md. The strategy given is the template and is not run
    (:func:`check_rebuildable`: what the rebuild cannot carry is refused; attributes set on the template after
    construction are not carried over).

    ``accountant`` is a name (``"rdp"``, ``"prv"``, ``"pld"``: ``privacy.accountant``) or an accountant with
    Flower's ``PrivacyAccountant`` interface; ``private_rounds`` a :class:`PrivateRounds` of your own (its
    ``ledger()`` accounts the releases: the budget guard, resumes and ``run.json`` follow it); the other keywords
    are ``privacy.*`` settings (``clip_norm``, ``noise_multiplier``, ``sample_rate``, ``delta``, ``target_epsilon``,
    ``max_epsilon``, ``placement``, ...), validated as the config validates them. Everything the rebuilt strategy
    offers (``dp_guarantee()``, ``account``, ``state()``, ...) is read through the layer.
    """

    def __init__(
        self,
        strategy: FederatedStrategy,
        *,
        accountant: PrivacyAccountant | str | None = None,
        private_rounds: PrivateRounds | None = None,
        **privacy: Any,
    ) -> None:
        super().__init__()
        check_rebuildable(strategy)
        if isinstance(accountant, str):
            privacy["accountant"], accountant = accountant, None
        if private_rounds is not None and accountant is not None:
            raise TypeError("ClientLevelDP: give the accountant to your private_rounds, not beside it")
        rounds = PrivateRounds(accountant) if private_rounds is None else private_rounds
        if not rounds.server_average:
            raise ValueError(
                "ClientLevelDP: private_rounds with server_average=False would release the plain mean with no noise "
                "under this layer (only a mechanism whose clients add all of the noise, Noisy-FedAvg, is built so)"
            )
        config = with_privacy_settings(strategy.config, privacy)
        #: The wrapped strategy, rebuilt with its rounds private.
        self.strategy = type(strategy)(config, privacy=rounds, **strategy.run_arguments)

    @classmethod
    def wraps(cls, strategy: object) -> bool:
        return isinstance(strategy, FederatedStrategy)

    def __getattr__(self, name: str) -> Any:
        # Only for what the layer does not define: the private strategy's run API (epsilon, dp_guarantee, ...).
        if name == "strategy":
            raise AttributeError(name)
        return getattr(self.strategy, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # The private strategy's attributes are read through the layer (__getattr__); a write would only shadow one
        # on the layer while the rounds kept theirs, so it is refused, saying where the attribute lives.
        if name != "strategy" and "strategy" in self.__dict__ and hasattr(self.strategy, name):
            raise AttributeError(
                f"{type(self).__name__}.{name} is the private strategy's: set it on the layer's .strategy, or build "
                "the layer with it (ClientLevelDP(..., clip_norm=...), the wrapped strategy's own settings)"
            )
        super().__setattr__(name, value)

    def __repr__(self) -> str:
        p = self.strategy.config.privacy
        return (
            f"ClientLevelDP({type(self.strategy).__name__}, q={p.sample_rate}, C={p.clip_norm}, "
            f"σ={self.strategy.noise_multiplier})"
        )

    # ----- Flower's hooks: the private rounds' ------------------------------------------------------------------

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        return self.strategy.aggregate_train(server_round, replies)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)

    def summary(self) -> None:
        self.strategy.summary()

    def start(self, *args: Any, **kwargs: Any) -> Any:
        """The private strategy's run (:meth:`strategies.run_loop.RoundLoop.start`)."""
        return self.strategy.start(*args, **kwargs)


class RegisteredDP(DPOverRounds):
    """A named DP strategy (``strategy=dp_fedsam``): :class:`ClientLevelDP` over its ``algorithm``, built from a
    validated config or from keyword settings over conf/strategy/<config_name>.yaml, as the algorithm is built, and
    checked by the algorithm's rules."""

    #: The plain strategy the layer wraps.
    algorithm: ClassVar[type[FederatedStrategy]]
    #: The strategy's config in conf/strategy/ (what keyword construction composes; the registry's name).
    config_name: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        algorithm = getattr(cls, "algorithm", None)
        if not (isinstance(algorithm, type) and issubclass(algorithm, FederatedStrategy)):
            raise TypeError(f"{cls.__name__}: a RegisteredDP names its plain strategy (algorithm = FedSAM)")
        for name in ALGORITHM_RULES:  # the algorithm's rules, unless the named strategy states its own
            if name not in cls.__dict__:
                setattr(cls, name, getattr(cls.algorithm, name))

    def __init__(
        self,
        config: AppConfig | None = None,
        /,
        *,
        accountant: PrivacyAccountant | str | None = None,
        **kwargs: Any,
    ) -> None:
        Strategy.__init__(self)
        run = {key: kwargs.pop(key) for key in RUN_ARGUMENTS if key in kwargs}
        if isinstance(accountant, str):
            kwargs["accountant"], accountant = accountant, None
        if config is None:
            config = compose_config(settings_overrides(self.config_name, kwargs, self.settings_class))
        elif kwargs:
            raise TypeError(f"{type(self).__name__}: pass either a config or keyword settings, not both")
        self.strategy = self.algorithm(config, privacy=PrivateRounds(accountant), **run)

    def __repr__(self) -> str:
        return f"{type(self).__name__}: {super().__repr__()}"


def check_rebuildable(strategy: FederatedStrategy) -> None:
    """Refuse a strategy the layer cannot rebuild as it was built: one private by its own mechanism, or whose class
    takes constructor arguments of its own (the rebuild passes its config and run arguments only, and would drop
    them). Attributes set on it after construction are not carried over either: set them on ``layer.strategy``."""
    if strategy.privacy is not None:
        raise ValueError(
            f"ClientLevelDP: {type(strategy).__name__} is private by its own mechanism already; wrap a plain strategy "
            "(FederatedAveraging, FedSAM, ...)"
        )
    own = [
        name
        for name, parameter in inspect.signature(type(strategy).__init__).parameters.items()
        if name not in ("self", "config", "privacy", *RUN_ARGUMENTS)
        and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
    ]
    if own:
        raise ValueError(
            f"ClientLevelDP: {type(strategy).__name__}'s constructor takes {', '.join(own)}, which the layer's rebuild "
            "(from the config and run arguments) would drop; build it with privacy=PrivateRounds() instead"
        )


def with_privacy_settings(config: AppConfig, settings: dict[str, Any]) -> AppConfig:
    """``config`` with the ``privacy.*`` ``settings``, validated as a composed config is (ConfigError naming a bad
    value; TypeError for a keyword that is no privacy setting)."""
    if not settings:
        return config
    if misplaced := sorted(set(settings) & set(RUN_ARGUMENTS)):
        raise TypeError(
            f"ClientLevelDP: pass {', '.join(misplaced)} to the wrapped strategy, e.g. FedSAM(..., {misplaced[0]}=...)"
        )
    known = set(DPConfig.__dataclass_fields__)
    if unknown := sorted(set(settings) - known):
        raise TypeError(f"ClientLevelDP: {', '.join(unknown)} not a privacy setting ({', '.join(sorted(known))})")
    raw = config.to_raw()
    raw["privacy"] = {**raw["privacy"], **settings}
    return validate(raw)
