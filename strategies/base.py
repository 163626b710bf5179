"""The round skeleton shared by every strategy: a custom Flower (Message API) strategy.

Privacy pipeline, in this order, every round t (SPEC §1, §2, §7; journal Alg. 1):

1. **Budget guard** — if one more round would take ε above ``privacy.max_epsilon``, stop *before* it.
2. **Sample** — clients (partition ids) drawn from the population of M by Poisson(q) or fixed-size m = qM
   without replacement, from the stream ``(seed, t, SAMPLING)``; the accountant accounts the same event.
3. **Configure** — each sampled client gets the global model and :class:`~fl_app.instructions.TrainInstructions`:
   its local optimizer (the strategy's recipe), C, σ, m and the noise placement. In cohort mode (simulation,
   ``population=virtual``) one message carries a cohort of sampled clients, cohorts balanced by local work
   (samples and steps).
4. **Client** (clients/): local SGD or SAM → Δ → clip to C on the global norm → (client placement) + N(0, σ²C²/m).
   A cohort worker does this for each of its clients separately (clients/cohort.py) and replies with the float64
   sum of its accepted clients' updates plus each client's statistics and fate.
5. **Validate** — replies with errors are counted as failed; non-finite or wrong-shape updates are rejected and
   counted. In server placement every update is clipped again to C: the server never trusts a client's clipping
   (a cohort's sum of k clients is held to k·C, after the worker re-clipped each client to C).
6. **Aggregate** — uniform sum in partition order divided by the **fixed** denominator m = qM (a missing client
   never raises the sensitivity above C/m); server placement adds N(0, σ²C²/m²); client placement tops the
   noise up for the clients that did not contribute, so the aggregate noise is always N(0, σ²C²/m²).
   The server optimizer steps along the average (``server_optimizer``: w ← w + η_g · average for sgd; FedOpt's
   momentum / Adagrad / Adam / Yogi otherwise): post-processing of the released average.
7. **Account** — the noisy model is logged as released (``releases.jsonl``, fsync-ed, with its digest:
   :mod:`fl_app.releases`) before it can leave the server, and the strategy's ledger (:mod:`fl_app.privacy.ledger`:
   the sampled Gaussian accountant, or Noisy-FedAvg's GDP bound) records the round (σ, q), whatever number of
   clients answered. A resumed run accounts every release logged after its checkpoint; a CSPRNG re-run round is a
   new release, a seeded one must repeat its logged release or is refused.
8. **Evaluate and record** — global test loss/accuracy, ε, norm statistics, one JSON line.

Non-private references (FedAvg, FedSAM) run the same skeleton with no clipping, no noise, no accountant and the
mean over the updates that arrived. Strategy subclasses only say which client recipe they use; the mechanism
math lives in :mod:`fl_app.privacy`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from logging import INFO, WARNING
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fl_app.audit.canaries import AuditResult, CanaryAudit
from fl_app.checkpoint import Checkpoint
from fl_app.choices import LocalOptimizer
from fl_app.config import AppConfig, ConfigError, StrategyConfig, compose_config, noise_stream_key, settings_overrides
from fl_app.instructions import (
    STREAM_ADAPTIVE_CLIP,
    STREAM_CANARY_SAMPLING,
    STREAM_SAMPLING,
    STREAM_SERVER_NOISE,
    STREAM_STATISTICS,
    LocalTrainingConfig,
    NoisyLocalConfig,
    RecipeSpec,
    TrainInstructions,
    local_training_config,
    make_train_instructions,
    resolve_cohort_engine,
)
from fl_app.metrics import OPERATOR_FILE, MetricsWriter
from fl_app.models import build_model_for_dataset, check_vectorizable, resolve_device
from fl_app.privacy import adaptive_clipping as adaptive
from fl_app.privacy import mechanisms as mech
from fl_app.privacy.ledger import PrivacyLedger, SampledGaussianLedger
from fl_app.privacy.pipeline import (
    GaussianNoise,
    Mechanism,
    ServerStep,
    mechanisms_for,
    run_server_steps,
)
from fl_app.privacy.prefetch import PrefetchedNormals
from fl_app.releases import Release, model_digest
from fl_app.server_optimizers import ServerOptimizer
from strategies.aggregation import RoundReplies
from strategies.auditing import CanaryAuditor, audit_report
from strategies.clipping import AdaptiveClipNorm, ClipNorm, clip_norm_for
from strategies.cohorts import balance_cohorts, cohort_count, local_work
from strategies.noise import update_noise_multiplier
from strategies.observers import RoundObserver
from strategies.placement import Placement, placement
from strategies.population import Population
from strategies.randomness import RunRandomness
from strategies.releasing import RunReleases
from strategies.rounds import RoundOutcome, RoundPlan, train_messages
from strategies.run_loop import run_rounds
from strategies.settings import CohortSize, RunSettings, is_simulation
from strategies.statistics import ClientStatistics

#: Flower's centralized evaluation: (server round, global model) -> metrics or None; the round record takes
#: ``test_loss`` and ``test_accuracy`` (and any other numbers) from it.
EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]
#: Called with the strategy whenever what it has released and accounted changes (after a resume's accounting and
#: after every round's, before the round's model can leave the server): the ServerApp rewrites run.json.
AccountedFn = Callable[["FederatedStrategy"], None]


@dataclass
class RoundInFlight:
    """A round between Flower's two hooks: its plan, the replies taken so far (bound, screened, admitted) and
    whether it is a seeded re-run that repeats a logged release (no new ε)."""

    plan: RoundPlan
    taken: RoundReplies
    repeat: bool


class FederatedStrategy(Strategy):
    """Sampling, validation, uniform fixed-denominator aggregation, noise placement, accounting, metrics."""

    #: Whether the strategy runs the client-level Gaussian mechanism and the accountant.
    private: ClassVar[bool] = True
    #: The local optimizer of the client recipe.
    local_optimizer: ClassVar[LocalOptimizer] = "sgd"
    #: The strategy's settings (``strategy.*``): a :class:`fl_app.config.StrategyConfig` subclass that validates
    #: its own fields; only these keys are accepted for the strategy.
    settings_class: ClassVar[type[StrategyConfig]] = StrategyConfig
    #: Whether ``privacy.client_statistics=noisy`` can be accounted (needs the sampled-Gaussian accountant).
    supports_noisy_statistics: ClassVar[bool] = True
    #: Why the strategy cannot run canary clients (``audit``), or None if it can (fl_app/config.py checks it).
    audit_refusal: ClassVar[str | None] = None
    #: Why the strategy cannot clip adaptively (``privacy.clipping=adaptive``), or None if it can.
    adaptive_clipping_refusal: ClassVar[str | None] = None

    #: The strategy's config in conf/strategy/ (what keyword construction composes).
    config_name: ClassVar[str] = ""

    def __init__(
        self,
        config: AppConfig | None = None,
        /,
        *,
        metrics: MetricsWriter | None = None,
        checkpoint_dir: Path | None = None,
        resume_from: Checkpoint | None = None,
        on_accounted: AccountedFn | None = None,
        observers: Sequence[RoundObserver] = (),
        **settings: Any,
    ) -> None:
        """Build the strategy from a validated ``config``, or from keyword ``settings`` over conf/'s defaults
        (``DPFedSAM(num_clients=100, clip_norm=0.5, num_rounds=20)``; :func:`fl_app.config.settings_overrides`
        says how a name finds its key), validated the same way.

        What a run needs beyond Flower's ``start()`` arguments comes here: ``metrics`` (the per-round writer),
        ``checkpoint_dir`` (checkpoints, the release log, the audit's files), ``resume_from`` (continue after that
        checkpoint), ``on_accounted`` (called whenever the released and accounted state changes) and ``observers``
        (:class:`strategies.observers.RoundObserver`: told about every completed round, after the metrics log and
        the checkpoint).
        """
        if config is None:
            config = compose_config(settings_overrides(self.config_name, settings, self.settings_class))
        elif settings:
            raise TypeError(f"{type(self).__name__}: pass either a config or keyword settings, not both")
        self.config = config
        self.metrics = metrics
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.resume_from = resume_from
        self.on_accounted = on_accounted
        self.observers = list(observers)
        #: Rounds completed by start() (a resumed run counts the rounds it ran).
        self.rounds_completed = 0
        privacy = config.privacy
        self.num_clients = config.dataset.num_clients
        if privacy.sampling == "fixed":
            self.expected_clients = float(round(privacy.sample_rate * self.num_clients))
        else:
            self.expected_clients = mech.expected_clients(self.num_clients, privacy.sample_rate)
        self.noise_multiplier = privacy.noise_multiplier
        #: The last key word of the run's seeded noise streams (``privacy.noise_stream=per_run``), None = the seed's
        #: shared noise: :meth:`noise_rng`, and the clients' noise through the instructions.
        self.noise_key: int | None = noise_stream_key(config)
        #: What the run has released and spent (None for the non-private references): :meth:`make_ledger`.
        self.ledger: PrivacyLedger | None = None
        #: What the run publishes about its clients (strategies/statistics.py); "auto" is resolved by
        #: resolve_settings() (raw in simulation, none against a real SuperLink).
        self.statistics = ClientStatistics(
            privacy.client_statistics, privacy.statistics_noise_multiplier or self.expected_clients / 20
        )
        if self.statistics.releases_noisy_count and not (self.private and self.supports_noisy_statistics):
            raise ConfigError(
                "invalid config value privacy.client_statistics=noisy: allowed only for strategies accounted by the "
                f"sampled-Gaussian accountant ({config.strategy.name} has none); use raw or none"
            )
        #: The clip norm of the coming round, C_t (strategies/clipping.py): fixed, or adaptive clipping's, which
        #: releases a noisy clipped count every round and so takes its share of the joint noise multiplier.
        self.clipping: ClipNorm = clip_norm_for(privacy, self.expected_clients, self.private)
        if self.private:
            self.ledger = self.make_ledger()
            self.noise_multiplier = update_noise_multiplier(config, self.statistics, self.clipping)
        #: Where the round's noise is added (strategies/placement.py).
        self.placement: Placement = placement(privacy.placement)
        opt = config.server_optimizer
        #: Step 6's last move, w ← step(w, average): post-processing of the released average (FedOpt).
        self.server_optimizer = ServerOptimizer(
            opt.name, lr=config.strategy.server_lr, momentum=opt.momentum, beta2=opt.beta2, eps=opt.eps
        )
        self.population = Population(config.population, self.num_clients)
        self._check_cohort_engine()
        #: The global model the last aggregated round started from (cross-round state: Fed-SMP-topk's global mask is
        #: the top-k of the last global update; checkpointed as ``previous_global``).
        self.last_round_global: list[np.ndarray] = []
        # The round between configure_train and aggregate_train (Flower's hooks share nothing else).
        self._in_flight: RoundInFlight | None = None
        #: The outcome of the last round aggregate_train released (what start()'s record and observers read).
        self.last_outcome: RoundOutcome | None = None
        # Whether prepare_run() has run (settings, nodes, audit: once, before the first message).
        self._prepared = False
        self.stop_reason: str | None = None
        #: The run's releases (strategies/releasing.py): the write-ahead log in ``checkpoint_dir`` (none without one);
        #: seeded until resolve_settings() knows the run's randomness.
        self.releases = RunReleases(self.checkpoint_dir, self.private, seeded=True)
        #: The settings resolved for where the run happens (strategies/settings.py): None until resolve_settings().
        self.run_settings: RunSettings | None = None
        #: The server's random sources (strategies/randomness.py); until resolve_settings(), "auto" is the seeded one.
        self.randomness = RunRandomness(
            secure=config.privacy.secure_noise is True,
            seed=config.seed,
            noise_key=self.noise_key,
            sampling=privacy.sampling,
            sample_rate=privacy.sample_rate,
        )
        # Until resolve_settings(): one message per client for "auto".
        size = config.simulation.cohort_size
        self.cohort_size: CohortSize = 1 if size == "auto" or config.population != "virtual" else int(size)
        #: Releases this run has logged (and accounted), resumed ones included: run.json's ``rounds_released``.
        self.rounds_released = 0
        #: The run's canary audit (``audit``; created by prepare_run()).
        self.auditor: CanaryAuditor | None = None
        if resume_from is not None:
            # Before anything can read the guarantee (run.json's first write, a failure before the first round).
            self._restore(resume_from)

    def resolve_settings(self, simulation: bool) -> None:
        """Resolve every setting that depends on where the run happens (strategies/settings.py), once, before
        anything is published: the first call decides, later calls do nothing."""
        if self.run_settings is not None:
            return
        settings = RunSettings.resolve(self.config, simulation)
        self.randomness = replace(self.randomness, secure=settings.secure_noise, deployment=not settings.simulation)
        self.statistics = replace(self.statistics, mode=settings.client_statistics)
        self.cohort_size = settings.cohort_size
        self.releases.seeded = not settings.secure_noise
        self.run_settings = settings

    def _restore(self, checkpoint: Checkpoint) -> None:
        """Restore the checkpoint's state and account every release logged after it (each left the server, and the
        ledger restored from the checkpoint has not counted it)."""
        self.load_state(checkpoint.strategy_state, checkpoint.strategy_arrays)
        logged = int(checkpoint.strategy_state.get("releases_logged", 0))
        self.rounds_released = int(checkpoint.strategy_state.get("releases_logged", checkpoint.round))
        owed = self.releases.owed_after(logged)
        for release in owed:
            self.account_release(release)
        self.rounds_released += len(owed)
        log(INFO, "Resuming after round %d (epsilon so far %.4g)", checkpoint.round, self.epsilon())

    def prepare_run(self, grid: Grid, initial_arrays: ArrayRecord, timeout: float | None = None) -> None:
        """Once, before the run's first message, whoever drives the hooks: every "auto" setting resolved for
        ``grid`` (seeded randomness refused on a grid that is not the simulation engine), the nodes connected, the
        canary audit set up. :meth:`configure_train` calls it; later calls do nothing."""
        if self._prepared:
            return
        self.resolve_settings(is_simulation(grid))
        self.summary()
        self.population.connect(grid, self.config.round_timeout if timeout is None else timeout)
        if self.config.audit.enabled:
            self.auditor = CanaryAuditor(
                self.config,
                shapes=[tuple(w.shape) for w in initial_arrays.to_numpy_ndarrays()],
                directory=None if self.checkpoint_dir is None else self.checkpoint_dir / "audit",
            )
            if (checkpoint := self.resume_from) is not None:
                state, arrays = checkpoint.strategy_state, checkpoint.strategy_arrays
                self.auditor.canaries.load_state(state, arrays, checkpoint.round)
        if not self.statistics.publishes_raw:
            log(INFO, "Counts of sampled, answering and rejected clients go only to %s (outside epsilon: the "
                "operator's own record, not to be published)", OPERATOR_FILE)  # fmt: skip
        self._prepared = True

    def over_budget(self, server_round: int) -> str | None:
        """Step 1, the budget guard: why ``server_round`` must not run (ε would pass ``privacy.max_epsilon``), or
        None."""
        limit = self.config.privacy.max_epsilon
        if not self.private or limit is None:
            return None
        next_eps = self.projected_epsilon()
        if next_eps <= limit:
            return None
        return f"budget guard: round {server_round} would take epsilon to {next_eps:.4f} > max_epsilon={limit}"

    def _check_cohort_engine(self) -> None:
        """Fail at construction (before Ray starts) if cohorts would be trained vectorized on a model that cannot be."""
        sim = self.config.simulation
        try:
            engine = resolve_cohort_engine(sim.cohort_engine, resolve_device(sim.device).type == "cuda")
        except ValueError as exc:
            raise ConfigError(f"invalid config value simulation.cohort_engine={sim.cohort_engine}: {exc}") from exc
        if sim.cohort_size == 1 or self.config.population != "virtual" or engine == "sequential":
            return
        try:
            check_vectorizable(build_model_for_dataset(self.config.model.name, self.config.dataset.name, seed=0))
        except ValueError as exc:
            raise ConfigError(
                f"invalid config value simulation.cohort_engine={sim.cohort_engine}: {exc}; "
                "set simulation.cohort_engine=sequential or simulation.cohort_size=1"
            ) from exc

    # ----- what the run reports about its guarantee -----------------------------------------------------------

    @property
    def noise_source(self) -> str:
        if not self.private:
            return "none"
        return self.randomness_source

    @property
    def secure_noise(self) -> bool:
        """Whether the server's and the clients' draws come from the OS CSPRNG (else seeded streams)."""
        return self.randomness.secure

    @property
    def randomness_source(self) -> str:
        return self.randomness.source()

    def make_ledger(self) -> PrivacyLedger:
        """The ledger that accounts this strategy's releases: the subsampled Gaussian mechanism's."""
        p = self.config.privacy
        return SampledGaussianLedger(p.delta, p.accountant, p.sampling, self.num_clients)

    def dp_guarantee(self) -> dict[str, Any]:
        """The run's DP claim, as written into ``run.json``: the ledger's account, the mechanism's parameters."""
        if not self.private:
            return {"dp_guarantee": "none: non-private reference", "client_statistics": self.client_statistics_claim()}
        assert self.ledger is not None
        claim = self.ledger.claim()
        statement = claim.pop("statement")
        reason = self.not_covered_reason()
        if self.auditor is not None and (warning := self.auditor.warning()) is not None:
            statement = f"{statement} -- {warning}"  # never the guarantee without the audit's contradiction
        return {
            "dp_guarantee": self.ledger.uncovered(reason) if reason else statement,
            **claim,
            **self.mechanism_claim(),
            "client_statistics": self.client_statistics_claim(),
            # Distinct noisy models that have left (or were logged to leave) the server, resumed runs included.
            "rounds_released": self.rounds_released,
            "noise_source": self.noise_source,
            "sampling_source": self.randomness_source,
            "noise_stream": self.noise_stream_claim(),
        }

    def mechanism_claim(self) -> dict[str, Any]:
        """The parameters of the mechanism the ledger accounts (``run.json``)."""
        p = self.config.privacy
        return {
            "noise_multiplier": self.noise_multiplier,
            "accounted_noise_multiplier": self.accounted_noise_multiplier,
            "clip_norm": p.clip_norm,
            "clipping": self.clipping_claim(),
            "sample_rate": p.sample_rate,
            "expected_clients": self.expected_clients,
            "placement": p.placement,
        }

    def noise_stream_claim(self) -> dict[str, Any]:
        return self.randomness.noise_stream_claim()

    def not_covered_reason(self) -> str | None:
        """Why the accountant's ε does not cover this configuration (None = it does)."""
        return None

    @property
    def clip_norm(self) -> float:
        """C_t, the clip norm of the coming round."""
        return self.clipping.clip_norm

    @property
    def adaptive_clipping(self) -> bool:
        return self.clipping.adaptive

    @property
    def clipped_count_stddev(self) -> float:
        """σ_b of adaptive clipping's count: ``privacy.clipped_count_stddev``, or m/20."""
        if isinstance(self.clipping, AdaptiveClipNorm):
            return self.clipping.count_stddev
        return self.config.privacy.clipped_count_stddev or adaptive.default_clipped_count_stddev(self.expected_clients)

    def clipping_claim(self) -> dict[str, Any]:
        """How C was chosen (``run.json``): fixed, or adaptive with its parameters and the latest C."""
        claim = self.clipping.claim()
        if self.adaptive_clipping:
            claim["update_noise_multiplier"] = self.noise_multiplier
        return claim

    @property
    def client_statistics(self) -> str:
        """The run's ``privacy.client_statistics`` mode (raw | noisy | none; "auto" until resolved)."""
        return self.statistics.mode

    def client_statistics_claim(self) -> str:
        """What the published files say about clients, and whether ε covers it (``run.json``)."""
        adaptive = self.clipping.count_stddev if isinstance(self.clipping, AdaptiveClipNorm) else None
        return self.statistics.claim(adaptive)

    def published_statistics(self, server_round: int, stats: dict[str, Any]) -> dict[str, Any]:
        """The round's statistics as ``privacy.client_statistics`` allows them to be published."""
        rng = partial(self.noise_rng, server_round, STREAM_STATISTICS)  # drawn only for a noisy count
        return self.statistics.published(stats, self.expected_clients, self.adaptive_clipping, rng)

    def epsilon(self) -> float:
        return math.inf if self.ledger is None else self.ledger.epsilon()

    def projected_epsilon(self) -> float:
        """ε after one more round (the budget guard's question)."""
        assert self.ledger is not None
        return self.ledger.projected_epsilon(self.accounted_noise_multiplier, self.config.privacy.sample_rate)

    @property
    def accounted_noise_multiplier(self) -> float:
        """The σ the accountant composes: the update's, or the joint one when noisy statistics are released too."""
        if self.noise_multiplier == 0:
            return self.noise_multiplier
        if self.adaptive_clipping:
            return self.clipping.joint_noise_multiplier(self.noise_multiplier)
        if not self.statistics.releases_noisy_count:
            return self.noise_multiplier
        return mech.joint_noise_multiplier(self.noise_multiplier, self.statistics.noise_multiplier)

    def account_round(self) -> None:
        if self.ledger is not None:
            self.ledger.step(self.accounted_noise_multiplier, self.config.privacy.sample_rate)

    def release(self, server_round: int, weights: list[np.ndarray]) -> Release:
        """This round's noisy model ``weights`` as a release (the write-ahead log's record)."""
        return Release(
            round=server_round,
            noise_multiplier=float(self.accounted_noise_multiplier),
            sample_rate=float(self.config.privacy.sample_rate),
            randomness="os-csprng" if self.secure_noise else "seeded",
            digest=model_digest(weights),
        )

    def account_release(self, release: Release) -> None:
        """Count a release logged after the checkpoint this run resumed from (the accountant restored from it has
        not seen it)."""
        if self.ledger is not None:
            self.ledger.step(release.noise_multiplier, release.sample_rate)

    def round_extras(self) -> dict[str, Any]:
        """Strategy-specific fields of the round record."""
        return {"gdp_mu": None}

    # ----- the client recipe and the round's shared mask (overridden by the sparsified / noisy methods) --------

    def client_recipe(self) -> RecipeSpec:
        """The recipe every client runs (sent as ``recipe.*``; :mod:`fl_app.privacy.pipeline` names its steps)."""
        return RecipeSpec()

    def server_mechanisms(self) -> tuple[Mechanism, ...]:
        """Server-only steps after the recipe's (e.g. DP-FedSAM-topk's top-k of the noised average)."""
        return ()

    @property
    def mechanisms(self) -> tuple[Mechanism, ...]:
        """The round's privacy pipeline: the recipe's mechanisms, then the server-only ones. Clients run their
        client steps; :meth:`combine` runs every server step on the average, in this order."""
        return mechanisms_for(self.client_recipe()) + self.server_mechanisms()

    def local_training(self) -> LocalTrainingConfig | NoisyLocalConfig:
        return local_training_config(self.config, self.local_optimizer)

    def round_mask(
        self, server_round: int, global_weights: list[np.ndarray], previous_global: list[np.ndarray]
    ) -> list[np.ndarray] | None:
        """A public, data-independent mask shared by every client this round (None = dense), from the round's global
        model and the one the previous round started from ([] before the first)."""
        return None

    @property
    def uses_previous_global(self) -> bool:
        """Whether :meth:`round_mask` reads ``previous_global`` (then a checkpoint stores it, for the resumed run's
        first mask)."""
        return False

    # ----- sampling (SPEC §1) ---------------------------------------------------------------------------------

    def round_rng(self, server_round: int, purpose: int) -> mech.RandomSource:
        """The server's draws of a round (sampling, masks): strategies/randomness.py."""
        return self.randomness.round_rng(server_round, purpose)

    def noise_rng(self, server_round: int, purpose: int) -> mech.RandomSource:
        """The server's noise draws of a round: strategies/randomness.py."""
        return self.randomness.noise_rng(server_round, purpose)

    def sample(self, population: int, rng: mech.RandomSource) -> np.ndarray:
        """The round's sampler (SPEC §1), for the real clients and the audit's canaries alike."""
        return self.randomness.sample(population, rng)

    def sample_clients(self, server_round: int) -> np.ndarray:
        # Secret when randomness is secure: amplification by subsampling assumes nobody can tell who took part.
        return self.sample(self.num_clients, self.round_rng(server_round, STREAM_SAMPLING))

    # ----- Flower Strategy interface ----------------------------------------------------------------------------

    def summary(self) -> None:
        p = self.config.privacy
        log(INFO, "Strategy %s (local optimizer: %s)", type(self).__name__, self.local_optimizer)
        log(
            INFO,
            "\tclients M=%d, sampling=%s q=%.4g, m=%.4g",
            self.num_clients,
            p.sampling,
            p.sample_rate,
            self.expected_clients,
        )
        if self.private:
            log(
                INFO,
                "\tC=%.4g sigma=%.4g placement=%s accountant=%s delta=%.3g noise=%s",
                p.clip_norm,
                self.noise_multiplier,
                p.placement,
                p.accountant,
                p.delta,
                self.noise_source,
            )
        else:
            log(INFO, "\tnon-private reference: no clipping, no noise")
        if self.private and (reason := self.not_covered_reason()):
            log(WARNING, "The reported epsilon does NOT cover this run: %s", reason)

    def plan_round(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord | None = None) -> RoundPlan:
        """Steps 2-3: sample the round's clients and build their train messages (one per client, or one per cohort).

        ``config`` (Flower's ``train_config``) is passed on to every client beside the instructions.
        """
        sampled = [int(pid) for pid in self.sample_clients(server_round).tolist()]
        return self.plan_for(server_round, arrays, sampled, config)

    def plan_for(
        self, server_round: int, arrays: ArrayRecord, sampled: list[int], config: ConfigRecord | None = None
    ) -> RoundPlan:
        """Step 3 for the sampled partitions ``sampled``: the round's mask, instructions and train messages."""
        config = ConfigRecord() if config is None else config
        global_weights = arrays.to_numpy_ndarrays()
        mask = self.round_mask(server_round, global_weights, self.last_round_global)
        instructions = self.train_instructions(server_round)
        cohorts = self.plan_cohorts(sampled)
        groups = cohorts if cohorts is not None else [[pid] for pid in sampled]
        # One message format: a message names its partitions (a cohort, or a cohort of one) and their faults.
        record = ConfigRecord({**instructions.to_config_record(), **config})
        sent = train_messages(server_round, arrays, groups, record, mask, self.population, self.config.fault_injection)
        return RoundPlan(
            server_round=server_round,
            global_weights=global_weights,
            instructions=instructions,
            sampled=len(sampled),
            sent=sent,
            mask=mask,
            cohort_mode=cohorts is not None,
        )

    def train_instructions(self, server_round: int) -> TrainInstructions:
        """What every client of the round is told: the recipe, the local procedure, C_t, σ, m, the noise placement."""
        return make_train_instructions(
            self.config,
            server_round,
            recipe=self.client_recipe(),
            training=self.local_training(),
            clip_norm=self.client_clip_norm,
            add_noise=self.private and self.placement.clients_add_noise,
            noise_multiplier=self.noise_multiplier if self.private else 0.0,
            expected_clients=self.expected_clients,
            secure_noise=self.secure_noise,
        )

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Flower's hook, steps 1-3: the run prepared (once), the budget guard, the round's sample and messages. The
        round's plan is kept for :meth:`aggregate_train` of the same round; a round the guard stops sends nothing."""
        if self.resume_from is not None and not self._prepared:
            raise RuntimeError(
                "resume_from: a resumed run continues after its checkpointed round with the checkpoint's model; "
                "run it with this strategy's start(), not a loop that starts at round 1"
            )
        self.prepare_run(grid, arrays)
        self._in_flight = None
        if self.stop_reason is not None:
            return []
        # A seeded re-run of a released round repeats that release (already counted) or is refused: no new ε.
        repeat = self.releases.repeats(server_round)
        if not repeat and (reason := self.over_budget(server_round)) is not None:
            self.stop_reason = reason
            log(WARNING, "Stopping before round %d: %s", server_round, reason)
            return []
        plan = self.plan_round(server_round, arrays, config)
        self._in_flight = RoundInFlight(plan, self.receiver(plan), repeat)
        return plan.messages

    @property
    def round_in_flight(self) -> RoundInFlight | None:
        """The round :meth:`configure_train` planned and :meth:`aggregate_train` has not yet released."""
        return self._in_flight

    @property
    def takes_replies_as_they_arrive(self) -> bool:
        """Whether start() may screen a round's replies as they arrive, before :meth:`aggregate_train` is called:
        only when this class's aggregate_train is the one that takes them (an override must see every reply)."""
        return type(self).aggregate_train is FederatedStrategy.aggregate_train

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's hook, steps 5-7: bind, screen and admit the replies, aggregate, add the noise, log the release
        ahead and account it; the released model and the round's statistics as ``privacy.client_statistics``
        allows them to be published (nothing else leaves in the MetricRecord). (None, None) after the budget
        guard stopped the run."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None and self.stop_reason is not None:
            return None, None
        if in_flight is None or in_flight.plan.server_round != server_round:
            raise RuntimeError(f"aggregate_train({server_round}) without configure_train of that round")
        in_flight.taken.take(replies)
        outcome = self.aggregate_taken(in_flight.taken)
        self._release(in_flight, outcome)
        published = {k: v for k, v in outcome.published.items() if isinstance(v, (int, float))}
        return ArrayRecord(outcome.new_weights), MetricRecord(published)

    def _release(self, in_flight: RoundInFlight, outcome: RoundOutcome) -> None:
        """Step 7: the round's model logged as released (write-ahead), accounted, run.json told, and the published
        statistics drawn, all before the model can leave the server."""
        server_round = in_flight.plan.server_round
        if self.auditor is not None:
            self.auditor.round_released(server_round, in_flight.plan.global_weights, outcome.new_weights)
        if self.private:
            self.releases.record(self.release(server_round, outcome.new_weights))
        if not in_flight.repeat:
            self.account_round()
            self.rounds_released += int(self.private)
        if self.on_accounted is not None:
            self.on_accounted(self)
        outcome.published = self.published_statistics(server_round, outcome.stats)
        self.last_outcome = outcome

    # ----- cohort mode (issue 12) ---------------------------------------------------------------------------

    def cohort_count(self, num_sampled: int) -> int:
        """How many cohort messages carry this round's clients (0 = one message per client)."""
        return cohort_count(self.cohort_size, num_sampled, self.population.num_nodes)

    def local_work(self, partition_id: int) -> int:
        """Client ``partition_id``'s work this round (:func:`strategies.cohorts.local_work`, for balancing cohorts)."""
        return local_work(self.config, self.local_training(), partition_id)

    def plan_cohorts(self, sampled: list[int]) -> list[list[int]] | None:
        """This round's cohorts (each sorted), balanced by local work; None = one message per client."""
        count = self.cohort_count(len(sampled))
        if count == 0:
            return None
        return balance_cohorts(sampled, [self.local_work(pid) for pid in sampled], count)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        # Evaluation is central (global test set on the server, SPEC §8); clients only train.
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None

    # ----- the aggregation of steps 5-6 -------------------------------------------------------------------------

    def _log_rejection(self, server_round: int, kind: str, reason: str) -> None:
        # Logs are published. A reason can name a partition (an error text a client wrote, a claimed id), and each
        # line counts a client: only runs that publish raw client statistics log them; the others keep the counts
        # in the operator's own record (operator_counts.jsonl).
        if self.statistics.publishes_raw:
            log(WARNING, "Round %d: reply rejected (%s): %s", server_round, kind, reason)

    def aggregate(self, plan: RoundPlan, replies: Iterable[Message]) -> RoundOutcome:
        """Steps 5-6 over the replies to ``plan``'s messages: bind, screen, admit, sum, noise, the server step."""
        taken = self.receiver(plan)
        taken.take(replies)
        return self.aggregate_taken(taken)

    def receiver(self, plan: RoundPlan) -> RoundReplies:
        """Step 5 for ``plan``'s replies, fed as they arrive (:meth:`RoundReplies.take`: bind, screen, admit);
        :meth:`aggregate_taken` then finishes the round."""
        return RoundReplies(plan, self.admit, self._log_rejection)

    def aggregate_taken(self, taken: RoundReplies) -> RoundOutcome:
        """Step 6 over what :meth:`receiver` took: the canaries, the sum over m, noise, the server step."""
        plan = taken.plan
        # Planning changes nothing on the strategy; the round's end does (the next round's previous global).
        self.last_round_global = plan.global_weights
        taken.add_canaries(self.num_clients, self.canary_updates(plan))
        updates, num_clients = taken.ordered()
        average = self.combine(plan, updates, num_clients)
        new_weights = self.server_optimizer.step(plan.global_weights, average)
        stats = taken.statistics(self.clip_norm)
        if self.private:
            stats["clip_norm"] = self.clip_norm
        if self.adaptive_clipping:
            # The aggregated clients' bits only: canaries and rejected clients have no part in m.
            rng = self.noise_rng(plan.server_round, STREAM_ADAPTIVE_CLIP)
            stats.update(self.clipping.after_round(taken.norms, self.expected_clients, rng))
        return RoundOutcome(new_weights=new_weights, stats=stats)

    def admit(
        self, plan: RoundPlan, total: list[np.ndarray], clients: int = 1, norm: float = math.nan
    ) -> tuple[list[np.ndarray], int]:
        """Step 5 for a screened sum of ``clients`` updates: the round's mask, the server's clip to clients·C;
        (sum, clients if it had to be re-clipped else 0). ``norm`` is the sum's global L2 norm as the screening
        measured it (NaN: measured here)."""
        if plan.mask is not None:
            # The round's mask is public; whatever a client sent outside it is dropped.
            total = mech.apply_mask(total, plan.mask)
            norm = math.nan  # the masked sum is another vector
        if not self.server_clips:
            return total, 0
        # Never trust the client's clipping: the sensitivity bound C/m must hold for any reply. A cohort's worker
        # re-clipped each client to C, so a sum of k such updates is within k·C.
        total, was_reclipped = mech.reclip(total, clients * self.clip_norm, norm=None if math.isnan(norm) else norm)
        return total, clients * int(was_reclipped)

    def canary_updates(self, plan: RoundPlan) -> list[tuple[int, list[np.ndarray]]]:
        """This round's canaries (``audit``) after the path a real client's update takes, then :meth:`admit`
        (strategies/auditing.py). Canaries are not counted in the number of clients (m, the top-up noise,
        statistics)."""
        if self.auditor is None:
            return []
        joined = self.sample(self.auditor.canaries.count, self.round_rng(plan.server_round, STREAM_CANARY_SAMPLING))
        sent = self.auditor.updates(plan, joined, self.clip_norm, self.secure_noise, self.num_clients)
        return [(index, self.admit(plan, update)[0]) for index, update in sent]

    @property
    def canaries(self) -> CanaryAudit | None:
        """The run's canary clients (None without ``audit``, or before start())."""
        return None if self.auditor is None else self.auditor.canaries

    @property
    def audit_result(self) -> AuditResult | None:
        """The latest evaluation of the audit."""
        return None if self.auditor is None else self.auditor.result

    @property
    def client_clip_norm(self) -> float:
        """C the client clips its update to (0 = no update clipping)."""
        return self.clip_norm if self.private else 0.0

    @property
    def server_clips(self) -> bool:
        return self.private and self.placement.server_clips

    def combine(self, plan: RoundPlan, updates: list[list[np.ndarray]], num_clients: int) -> list[np.ndarray]:
        """Step 6: uniform sum over the fixed denominator m, then the pipeline's server steps (the server's share of
        the noise, the noise's support, post-processing: :attr:`mechanisms`).

        ``updates`` are client updates or cohort sums of them (their sum is the same); ``num_clients`` is the
        number of client updates they hold.
        """
        if not self.private:
            return mech.uniform_average(updates, max(num_clients, 1), plan.shapes)
        average = mech.uniform_average(updates, self.expected_clients, plan.shapes)
        rng = plan.server_noise
        if rng is None:
            rng = self.noise_rng(plan.server_round, STREAM_SERVER_NOISE)
        step = ServerStep(
            noise_std=self.placement.server_noise_std(
                self.noise_multiplier, self.clip_norm, self.expected_clients, num_clients
            ),
            rng=rng,
            mask=plan.mask,
            updates=updates,
        )
        return run_server_steps(self.mechanisms, average, step)

    def draw_noise_ahead(self, plan: RoundPlan) -> None:
        """Start drawing the round's server noise on a background thread (:class:`PrefetchedNormals`, the same
        stream :meth:`combine` would draw from, so the same values): the run calls this when the round's first
        reply is in, so the draw runs on the core that worker freed instead of after the last reply. Only where the
        server adds noise whoever answers (server placement); idempotent."""
        if plan.server_noise is not None or not self.private or self.placement.clients_add_noise:
            return
        if not any(isinstance(mechanism, GaussianNoise) for mechanism in self.mechanisms):
            return
        plan.server_noise = PrefetchedNormals(self.noise_rng(plan.server_round, STREAM_SERVER_NOISE), plan.shapes)

    # ----- the run -----------------------------------------------------------------------------------------------

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
    ) -> Result:
        """Run the rounds (steps 1-8 of the module docstring) and return Flower's :class:`Result`, as
        :meth:`flwr.serverapp.strategy.Strategy.start` does: ``result.arrays`` the last released model,
        ``train_metrics_clientapp`` the round's published client metrics (mean local train loss/accuracy under
        raw client statistics), ``evaluate_metrics_serverapp`` what ``evaluate_fn`` returned for the initial model
        (round 0, unless resuming; evaluated after the first round's release, so that round does not wait for it) and
        after every ``eval_every``-th round and the last. Evaluation is central:
        ``evaluate_config`` is accepted and unused (clients only train).

        With ``checkpoint_dir`` (constructor) the state after every ``checkpoint_every``-th round (and the last) is
        saved atomically; ``resume_from`` continues after the checkpointed round with its model and ledger;
        ``on_accounted`` is called after the resume's accounting and after every round's, before that round's model
        can leave the server (the ServerApp keeps run.json true with it).
        """
        return run_rounds(self, grid, initial_arrays, num_rounds, timeout, train_config, evaluate_fn)

    # ----- canary audit (docs/audit.md) -----------------------------------------------------------------------

    def evaluate_audit(self, server_round: int) -> dict[str, Any]:
        """Score the canaries after ``server_round`` against the ledger (strategies/auditing.py)."""
        assert self.auditor is not None
        return self.auditor.evaluate(server_round, *self._audit_epsilons())

    def _audit_epsilons(self) -> tuple[float | None, Any]:
        epsilon = self.epsilon() if self.private else None
        return epsilon, (self.ledger.epsilon_at if self.ledger is not None else None)

    def finish_audit(self, checkpoint_dir: Path | None, num_rounds: int) -> None:
        """Evaluate the audit once more if the run stopped early, save ``audit.npz``, drop the kept deltas."""
        if self.auditor is not None:
            self.auditor.finish(checkpoint_dir, *self._audit_epsilons())

    def audit_report(self) -> dict[str, Any] | None:
        """``run.json``'s ``audit`` section (None when the run has no canaries)."""
        return audit_report(self.config, self.auditor)

    # ----- checkpoint state ---------------------------------------------------------------------------------

    def state(self) -> tuple[dict[str, Any], dict[str, list[np.ndarray]]]:
        """What a resumed run needs beyond the global model: the accountant, the server optimizer's state, the
        previous global model where the round mask needs it (:attr:`uses_previous_global`) and the canaries' scored
        statistics. The arrays are snapshots the strategy never changes in place afterwards (a checkpoint is written
        from them while the next round runs: strategies/observers.py)."""
        ledger = self.ledger.state_dict() if self.ledger is not None else {"accountant": None}
        optimizer_state, optimizer_arrays = self.server_optimizer.state()
        state = {**ledger, **optimizer_state, **self.clipping.state(), "releases_logged": self.releases.logged}
        arrays = dict(optimizer_arrays)
        if self.uses_previous_global:  # a second copy of the model in every checkpoint, only where a mask needs it
            arrays["previous_global"] = list(self.last_round_global)
        if self.auditor is not None:
            audit_state, audit_arrays = self.auditor.canaries.state()
            state.update(audit_state)
            arrays.update(audit_arrays)
        return state, arrays

    def load_state(self, state: dict[str, Any], arrays: dict[str, list[np.ndarray]]) -> None:
        if self.ledger is not None:
            self.ledger.load_state_dict(state)
        self.server_optimizer.load_state(state, arrays)
        # Adaptive clipping's C for the round after the checkpoint (older checkpoints: the fixed C).
        self.clipping.load_state(state)
        # The global model the checkpointed round started from: the "previous global" of the next round.
        self.last_round_global = list(arrays.get("previous_global", []))
