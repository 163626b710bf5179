"""The round skeleton shared by every strategy: a custom Flower (Message API) strategy.

Every round t (journal Alg. 1; docs/mechanisms.md states each step and its privacy argument):

1. **Budget guard** — no round whose release would take ε above ``privacy.max_epsilon`` (client_dp/budget.py).
2. **Sample** — Poisson(q) or fixed-size m = qM, seeded or the OS CSPRNG (client_dp/sampling.py, randomness.py).
3. **Configure** — the global model and the TrainInstructions (recipe, C, σ, m, placement), a client or a cohort each.
4. **Client** (clients/) — SGD or SAM → Δ → clip to C → + N(0, σ²C²/m) (client placement), or Skellam (distributed).
5. **Screen and admit** — bind, reject the malformed (screening.py), re-clip (k·C a cohort) where the server clips.
6. **Aggregate** — the sum over the **fixed** m, the placement's noise, the server steps (client_dp/average.py), then
   the server optimizer (post-processing).
7. **Account** — the release logged ahead, then composed by the ledger, before the model can leave (releasing.py).
8. **Evaluate and record** — global test loss/accuracy, ε, norm statistics, one JSON line.

A plain algorithm (built without :class:`PrivateRounds`: FedAvg, FedSAM, ...) runs the same skeleton without steps 1
and 7 or a noisy average: no clipping, no noise, the mean of what arrived. Subclasses say which client recipe runs;
the mechanism math lives in :mod:`fl_app.privacy`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from functools import cached_property, partial
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fl_app.checkpoint import Checkpoint
from fl_app.config import AppConfig, compose_config, noise_stream_key, settings_overrides
from fl_app.empty_rounds import EmptyRoundWatch
from fl_app.instructions import (
    LocalTrainingConfig,
    NoisyLocalConfig,
    TrainInstructions,
    local_training_config,
)
from fl_app.metrics import OPERATOR_FILE, MetricsWriter
from fl_app.privacy.pipeline import Mechanism, mechanisms_for
from strategies.aggregation import RoundInFlight
from strategies.auditing import CanaryAuditor
from strategies.client_dp import NoisyAverage, PrivacyAccount
from strategies.client_dp.clipping import ClipNorm, clip_norm_for
from strategies.client_dp.placement import Placement, placement
from strategies.client_dp.private_rounds import PrivateRounds
from strategies.client_dp.randomness import RunRandomness
from strategies.client_dp.releasing import RunReleases
from strategies.client_dp.sampling import ClientSampler, client_sampler, fixed_denominator, log_refusals
from strategies.cohorts import plan_cohorts
from strategies.declarations import StrategyDeclarations
from strategies.flower_step import server_step
from strategies.guarantee import log_summary, population_claim, run_claim, statistics_claim
from strategies.noise import NoiseMultipliers
from strategies.observers import RoundObserver
from strategies.population import Population
from strategies.round_aggregator import RoundAggregator
from strategies.rounds import RoundOutcome, RoundPlan, RunInstructions, train_messages
from strategies.run_loop import RoundLoop
from strategies.run_state import RunState, StateArrays
from strategies.settings import CohortSize, RunSettings, check_cohort_engine, initial_cohort_size, is_simulation
from strategies.statistics import ClientStatistics, released_line

#: Called with the strategy whenever what it has released and accounted changes (after a resume's accounting and
#: after every round's, before the round's model can leave the server): the ServerApp rewrites run.json.
AccountedFn = Callable[["FederatedStrategy"], None]


class FederatedStrategy(StrategyDeclarations, RoundLoop, Strategy):
    """A plain algorithm, or (built with :class:`PrivateRounds`, as :class:`strategies.client_level_dp.ClientLevelDP`
    builds it) client-level DP rounds; what a subclass declares: :class:`StrategyDeclarations`."""

    def __init__(
        self,
        config: AppConfig | None = None,
        /,
        *,
        privacy: PrivateRounds | None = None,
        metrics: MetricsWriter | None = None,
        checkpoint_dir: Path | None = None,
        resume_from: Checkpoint | None = None,
        on_accounted: AccountedFn | None = None,
        observers: Sequence[RoundObserver] = (),
        **settings: Any,
    ) -> None:
        """Build the strategy from a validated ``config``, or from keyword ``settings`` over conf/'s defaults
        (``FedSAM(num_clients=100, num_rounds=20)``; :func:`fl_app.config.settings_overrides`). ``privacy``
        (:class:`PrivateRounds`) makes every round client-level DP; without it the strategy is the plain algorithm.
        Beyond Flower's ``start()`` arguments: ``metrics`` (the per-round writer), ``checkpoint_dir`` (checkpoints,
        release log, audit files), ``resume_from`` (continue after that checkpoint), ``on_accounted`` (called whenever
        the released and accounted state changes), ``observers`` (:class:`RoundObserver`s, told of every round)."""
        if config is None:
            config = compose_config(settings_overrides(self.config_name, settings, self.settings_class))
        elif settings:
            raise TypeError(f"{type(self).__name__}: pass either a config or keyword settings, not both")
        self.config = config
        #: What makes the rounds private (None: the plain algorithm).
        self.privacy = privacy
        if privacy is not None and not privacy.server_average and self.client_recipe().kind != "noisy_model":
            # Only Noisy-FedAvg's clients add all of the noise: any other recipe would be released noise-free.
            raise ValueError(f"{type(self).__name__}: server_average=False with a recipe whose clients add no noise")
        #: What the run was given beyond its config and privacy (the constructor's keywords): what a layer that
        #: rebuilds the strategy with its privacy passes on.
        self.run_arguments = {"metrics": metrics, "checkpoint_dir": checkpoint_dir, "resume_from": resume_from,
                              "on_accounted": on_accounted, "observers": observers}  # fmt: skip
        self.metrics = metrics
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.resume_from = resume_from
        self.on_accounted = on_accounted
        self.observers = list(observers)
        #: Rounds completed by start() (a resumed run counts the rounds it ran).
        self.rounds_completed = 0
        self._init_privacy(config)
        #: Step 6's last move, w ← step(w, average): post-processing of the released average (FedOpt: ours, or
        #: Flower's own strategy's step, strategies/flower_step.py).
        self.server_optimizer = server_step(config)
        self.population = Population(config.population, self.num_clients)
        check_cohort_engine(self.config)
        self._init_run_state(config)
        if resume_from is not None:
            # Before anything can read the guarantee (run.json's first write, a failure before the first round).
            self.run_state.restore(resume_from)

    def _init_privacy(self, config: AppConfig) -> None:
        """Client-level DP's objects (strategies/client_dp/): m, σ, the clip norm, the placement, what is published
        about clients, the budget and the noisy average, from ``config.privacy`` and :attr:`privacy`."""
        privacy = config.privacy
        self.num_clients = config.dataset.num_clients
        #: m = qM, the fixed denominator of every round's average (strategies/client_dp/sampling.py).
        self.expected_clients = fixed_denominator(privacy.sampling, privacy.sample_rate, self.num_clients)
        #: Who takes part in each round: ``privacy.sampling``'s sampler (strategies/client_dp/sampling.py).
        self.sampler: ClientSampler = client_sampler(privacy, self.num_clients, self.expected_clients)
        self.noise_multiplier = privacy.noise_multiplier
        #: The last key word of the run's seeded noise streams (``privacy.noise_stream=per_run``; None: shared).
        self.noise_key: int | None = noise_stream_key(config)
        #: What the run publishes about its clients (statistics.py); "auto" until resolve_settings().
        self.statistics = ClientStatistics(
            privacy.client_statistics, privacy.statistics_noise_multiplier or self.expected_clients / 20
        )
        sampled_gaussian = self.privacy is not None and self.supports_noisy_statistics  # what accounts a count
        self.statistics.refuse_unaccounted_count(sampled_gaussian, config.strategy.name)
        #: C_t, the clip norm of the coming round (client_dp/clipping.py): fixed, or adaptive clipping's.
        self.clipping: ClipNorm = clip_norm_for(privacy, self.expected_clients, may_adapt=self.privacy is not None)
        #: Where the round's noise is added (strategies/client_dp/placement.py); a recipe may read it (DP-FedSAM-topk).
        self.placement: Placement = placement(config)
        #: What the run's releases spend and what run.json states of it (client_dp/account.py; None: plain).
        self.account: PrivacyAccount | None = None
        if self.privacy is not None:
            # A mechanism of its own (the strategy's, the placement's) states its ledger and σ; else noise.py's.
            ledger = (self.make_ledger()
                      or self.placement.ledger(privacy.delta, self.num_clients, self.privacy.accountant)
                      or self.privacy.ledger(privacy, self.num_clients))  # fmt: skip
            own = self.calibrated_noise_multiplier() or self.placement.noise_multiplier
            sigmas = NoiseMultipliers.for_run(config, self.statistics, self.clipping, own)
            self.noise_multiplier = sigmas.update
            self.account = PrivacyAccount.for_rounds(ledger, self.mechanisms, privacy, sigmas.update,
                                                     sigmas.accounted, self.clipping, self.expected_clients)
        #: The released average over m, clipped and noised (client_dp/average.py); None: the plain mean of what arrived.
        self.noisy_average: NoisyAverage | None = None
        if self.account is not None and self.privacy is not None and self.privacy.server_average:
            self.noisy_average = NoisyAverage(self.mechanisms, self.placement, self.clipping,
                                              noise_multiplier=self.noise_multiplier,
                                              expected_clients=self.expected_clients)  # fmt: skip

    def _init_run_state(self, config: AppConfig) -> None:
        """What the run carries from round to round and resolves once: the round in flight, the releases, the
        settings and randomness of where the run happens, the cohort size, the audit."""
        #: The run's part of every round's instructions (:meth:`train_instructions`).
        self.run_instructions: RunInstructions | None = None
        #: The round configure_train planned and aggregate_train has not yet released (all the hooks share).
        self.in_flight: RoundInFlight | None = None
        #: The outcome of the last round aggregate_train released (what start()'s record and observers read).
        self.last_outcome: RoundOutcome | None = None
        # Whether prepare_run() has run (settings, nodes, audit: once, before the first message).
        self._prepared = False
        self.stop_reason: str | None = None
        #: Consecutive rounds in which nobody's update was accepted: the run fails after ``max_empty_rounds``.
        self.empty_rounds = EmptyRoundWatch(config.max_empty_rounds)
        #: The run's releases: the write-ahead log in ``checkpoint_dir``; seeded until resolve_settings().
        self.releases = RunReleases(None if self.account is None else self.checkpoint_dir, seeded=True)
        #: What a checkpoint stores and a resume restores, with the previous round's global model (run_state.py).
        self.run_state = RunState(self.account, self.releases, self.clipping, self.sampler, self.server_optimizer,
                                  self.mechanisms, keeps_previous_global=self.uses_previous_global)  # fmt: skip
        #: The settings resolved for where the run happens (strategies/settings.py): None until resolve_settings().
        self.run_settings: RunSettings | None = None
        #: The server's random sources; until resolve_settings(), "auto" is the seeded one.
        self.randomness = RunRandomness.for_config(config.privacy, config.seed, self.noise_key)
        self.cohort_size: CohortSize = initial_cohort_size(config)  # resolved by resolve_settings()
        #: The run's canary audit (``audit``; created by prepare_run()).
        self.auditor: CanaryAuditor | None = None

    def resolve_settings(self, simulation: bool) -> None:
        """Resolve every setting that depends on where the run happens (strategies/settings.py), once, before
        anything is published: the first call decides, later calls do nothing."""
        if self.run_settings is not None:
            return
        settings = RunSettings.resolve(self.config, simulation)
        if self.resume_from is not None:  # the randomness the checkpoint was made with, or refused
            self.run_state.check_resume_randomness(self.resume_from, settings.secure_noise)
        self.randomness = replace(self.randomness, secure=settings.secure_noise, deployment=not settings.simulation)
        self.statistics = replace(self.statistics, mode=settings.client_statistics)
        self.cohort_size = settings.cohort_size
        self.releases.seeded = not settings.secure_noise
        self.run_settings = settings

    def prepare_run(self, grid: Grid, initial_arrays: ArrayRecord, timeout: float | None = None) -> None:
        """Once, before the run's first message, whoever drives the hooks: every "auto" setting resolved for
        ``grid`` (seeded randomness refused on a grid that is not the simulation engine), the nodes connected, the
        canary audit set up. :meth:`configure_train` calls it; later calls do nothing."""
        if self._prepared:
            return
        self.resolve_settings(is_simulation(grid))
        if self.account is not None:  # a pipeline that makes no privacy event is refused before anything is released
            self.account.budget.events()
        self.summary()
        log(INFO, "\tserver optimizer: %s", self.server_optimizer.describe())
        self.population.connect(grid, self.config.round_timeout if timeout is None else timeout)
        if self.config.audit.enabled:
            shapes = [tuple(w.shape) for w in initial_arrays.to_numpy_ndarrays()]
            self.auditor = CanaryAuditor.for_run(self.config, shapes, self.checkpoint_dir, self.resume_from,
                                                 self.randomness.secret_key)  # fmt: skip
        if not self.statistics.publishes_raw:
            log(INFO, "Counts of sampled, answering and rejected clients go only to %s (outside epsilon: the "
                "operator's own record, not to be published)", OPERATOR_FILE)  # fmt: skip
        self._prepared = True

    @cached_property
    def mechanisms(self) -> tuple[Mechanism, ...]:
        """The round's privacy pipeline: the recipe's mechanisms, then the server-only ones. Clients run their
        client steps; :meth:`combine` runs every server step on the average, in this order. Built once, so a
        mechanism may hold state across rounds (``state_dict`` / ``load_state_dict``: checkpointed and resumed by
        :class:`~strategies.run_state.RunState`)."""
        return self.placement.pipeline(mechanisms_for(self.client_recipe()) + self.server_mechanisms())

    def local_training(self) -> LocalTrainingConfig | NoisyLocalConfig:  # the clients' local procedure
        return local_training_config(self.config, self.local_optimizer)

    # ----- sampling (docs/mechanisms.md, 1) -------------------------------------------------------------------

    def sample_clients(self, server_round: int, grid: Grid | None = None) -> np.ndarray:
        """Round ``server_round``'s clients, by the run's sampler (strategies/client_dp/sampling.py) from the clients
        available on ``grid`` (all of them without one). Secret when randomness is secure: amplification by
        subsampling assumes nobody can tell who took part."""
        everyone = partial(range, self.num_clients)
        available = everyone if grid is None else partial(self.population.available_clients, grid)
        sample = self.sampler.sample_clients(server_round, self.randomness, available)
        log_refusals(server_round, sample.refused, self.statistics.publishes_raw)
        return sample.clients

    # ----- Flower Strategy interface ----------------------------------------------------------------------------

    def plan_round(
        self,
        server_round: int,
        arrays: ArrayRecord,
        config: ConfigRecord | None = None,
        grid: Grid | None = None,
        sampled: list[int] | None = None,
    ) -> RoundPlan:
        """Steps 2-3: sample the round's clients (among those available on ``grid``; ``sampled``: these partitions)
        and build the round's mask, instructions and train messages (one per client, or one per cohort).
        ``config`` (Flower's ``train_config``) is passed on to every client beside the instructions."""
        if sampled is None:
            sampled = [int(pid) for pid in self.sample_clients(server_round, grid).tolist()]
        config = ConfigRecord() if config is None else config
        global_weights = arrays.to_numpy_ndarrays()
        mask = self.round_mask(server_round, global_weights, self.run_state.previous_global)
        instructions = self.train_instructions(server_round)
        cohorts = plan_cohorts(self.config, self.local_training(), sampled, self.cohort_size, self.population.num_nodes)
        groups = cohorts if cohorts is not None else [[pid] for pid in sampled]
        # One message format: a message names its partitions (a cohort, or a cohort of one) and their faults.
        record = ConfigRecord({**instructions.to_config_record(), **config})
        sent = train_messages(server_round, arrays, groups, record, mask, self.population, self.config.fault_injection)
        return RoundPlan(server_round=server_round, global_weights=global_weights, instructions=instructions,
                         sampled=len(sampled), sent=sent, mask=mask, cohort_mode=cohorts is not None)  # fmt: skip

    def train_instructions(self, server_round: int) -> TrainInstructions:
        """What every client of the round is told: the recipe, the local procedure, C_t, σ, m, the noise placement
        (the run's part built once: :class:`~strategies.rounds.RunInstructions`)."""
        if self.run_instructions is None:  # after the constructor: the recipe may read what it set
            self.run_instructions = RunInstructions(
                self.config, self.client_recipe(), self.local_training(),
                add_noise=self.account is not None and self.placement.clients_add_noise,
                noise_multiplier=0.0 if self.account is None else self.noise_multiplier,
                expected_clients=self.expected_clients,
                secure_aggregation=self.account is not None and self.placement.secure_aggregation,
            )  # fmt: skip
        clips = self.account is not None and self.clips_updates  # 0 below: a plain algorithm's clients clip nothing
        return self.run_instructions.for_round(server_round, self.clipping.clip_norm if clips else 0.0,
                                               self.randomness.secure)  # fmt: skip

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
        self.in_flight = None
        if self.stop_reason is not None:
            return []
        # A seeded re-run of a released round repeats that release (already counted) or is refused: no new ε.
        reason = None if self.account is None else self.releases.guard(self.account.budget, server_round)
        if reason is not None:
            self.stop_reason = reason
            log(WARNING, "Stopping before round %d: %s", server_round, reason)
            return []
        plan = self.plan_round(server_round, arrays, config, grid)
        self.server_optimizer.begin_round(server_round, arrays, grid)
        takes_early = type(self).aggregate_train is FederatedStrategy.aggregate_train  # an override sees every reply
        self.in_flight = RoundInFlight(plan, self.aggregator.receiver(plan), takes_early)
        return plan.messages

    @property
    def aggregator(self) -> RoundAggregator:
        """Steps 5-6 (strategies/round_aggregator.py) over the strategy's objects as they stand (resolved)."""
        return RoundAggregator(self.num_clients, self.expected_clients, self.clipping, self.noisy_average,
                               self.server_optimizer, self.randomness, self.statistics, self.sampler, self.auditor,
                               states_clip_norm=self.account is not None)  # fmt: skip

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's hook, steps 5-7: bind, screen and admit the replies, aggregate, add the noise, log the release
        ahead and account it; the released model and the round's statistics as ``privacy.client_statistics``
        allows them to be published (nothing else leaves in the MetricRecord). (None, None) after the budget
        guard stopped the run."""
        in_flight, self.in_flight = self.in_flight, None
        if in_flight is None and self.stop_reason is not None:
            return None, None
        if in_flight is None or in_flight.plan.server_round != server_round:
            raise RuntimeError(f"aggregate_train({server_round}) without configure_train of that round")
        in_flight.taken.take(replies)
        outcome = self.aggregator.aggregate_taken(in_flight.taken)
        # The round's end changes the strategy (planning does not): the next round's previous global model.
        self.run_state.previous_global = in_flight.plan.global_weights
        self._release(in_flight, outcome)
        # After the release is logged and accounted: a run in which nobody trains fails, with its ε stated.
        taken = in_flight.taken
        causes = taken.causes() if self.statistics.publishes_raw else None
        self.empty_rounds.observe(server_round, taken.plan.sampled, int(outcome.stats.get("aggregated", 0)), causes)
        published = {k: v for k, v in outcome.published.items() if isinstance(v, (int, float))}
        return ArrayRecord(outcome.new_weights), MetricRecord(published)

    def _release(self, in_flight: RoundInFlight, outcome: RoundOutcome) -> None:
        """Step 7: the round's model logged as released (write-ahead), accounted, run.json told, and the published
        statistics drawn, all before the model can leave the server."""
        server_round = in_flight.plan.server_round
        if self.auditor is not None:
            self.auditor.round_released(server_round, in_flight.plan.global_weights, outcome.new_weights)
        if self.account is not None:  # logged ahead and accounted (a seeded re-run's repeat: no new ε)
            self.releases.release(self.account.budget, server_round, outcome.new_weights, self.randomness.secure)
        # Who was sent a message took part, whether or not it answered (the participation rule's record).
        self.sampler.round_released(server_round, [pid for _, ids in in_flight.plan.sent for pid in ids])
        if self.on_accounted is not None:
            self.on_accounted(self)
        outcome.published = self.aggregator.published_statistics(server_round, outcome.stats)
        self.last_outcome = outcome
        if self.metrics is None:  # start() with a metrics writer prints its own line; any other loop gets this one
            epsilon, delta = (None, None) if self.account is None else (self.epsilon(), self.config.privacy.delta)
            log(INFO, "Round %d released: %s", server_round, released_line(outcome.published, epsilon, delta))

    def epsilon(self) -> float:
        """ε spent so far at ``privacy.delta`` (inf for a plain algorithm, which guarantees nothing)."""
        return math.inf if self.account is None else self.account.epsilon()

    def dp_guarantee(self) -> dict[str, Any]:
        """The run's DP claim, as written into ``run.json`` (:func:`strategies.guarantee.run_claim`)."""
        warning = None if self.auditor is None else self.auditor.warning()
        return run_claim(self.account, self.randomness, self.mechanism_claim(), self.not_covered_reason(), warning,
                         statistics_claim(self.statistics, self.clipping),
                         population_claim(self.run_settings, self.config.population))  # fmt: skip

    def summary(self) -> None:
        """Log the strategy's settings as the run starts (:func:`strategies.guarantee.log_summary`)."""
        log_summary(type(self).__name__, self.local_optimizer, self.config.privacy, self.num_clients,
                    self.expected_clients, self.account, self.randomness, self.not_covered_reason())  # fmt: skip

    def state(self) -> tuple[dict[str, Any], StateArrays]:
        """What a checkpoint stores beyond the global model (:meth:`RunState.state`), as the run resolved it."""
        return self.run_state.state(self.randomness, self.auditor)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        # Evaluation is central (global test set on the server, docs/running.md "Metrics"); clients only train.
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None
