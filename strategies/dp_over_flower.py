"""The client-level DP layer around Flower's own FedAvg-family strategies (DP-FedAvg: McMahan, Ramage, Talwar,
Zhang, ICLR 2018): what ``ClientLevelDP(FedAdam(...), ...)`` builds (strategies/client_level_dp.py).

:class:`DPOverFlowerMean` wraps a ``flwr.serverapp.strategy.FedAvg`` (or FedAvgM, FedProx, FedAdam, FedYogi,
FedAdagrad) and makes every training round the sampled Gaussian mechanism of docs/mechanisms.md (sampling: 1; the
mechanism: 2–4; accounting: 6–8):

- sampling: the layer draws the round's clients itself (Poisson(q) over the M connected nodes, one client a node,
  or exactly m = qM without replacement) from the OS CSPRNG (``secure=True``) or the seeded stream (seed, k,
  :data:`SAMPLING_STREAM`) of the k-th round it starts; the inner strategy only builds the messages (its config
  goes along, e.g. FedProx's ``proximal-mu``), and the layer sends those of the sampled nodes.
- the mechanism: each accepted reply's update Δ_i = trained − global (float64) is clipped to global L2 norm C, and
  the round releases w + (1/m) Σ_i Δ̃_i + Z, Z ~ N(0, (σC/m)²·I), over the FIXED m whoever answered, *through the
  inner strategy's own mean*: n replies w + (n/m)·Δ̃_i + Z of unit weight, whose unweighted mean is exactly that
  (with no accepted reply, one synthetic reply w + Z). What the inner strategy does with the mean afterwards
  (FedAdam's step, FedAvgM's momentum) is post-processing; its result is cast back to the model's dtypes.
- accounting: each release is written ahead to ``release_dir``'s log (:mod:`fl_app.releases`), accounted by our
  strategies' ledger (RDP/PRV/PLD, the without-replacement RDP event, or an accountant with Flower's
  ``PrivacyAccountant`` interface) over our ``dense`` recipe's privacy events, and only then returned. The budget
  guard stops before the round that would pass ``max_epsilon``; the arguments follow our ``privacy`` config's rules
  (:func:`strategies.flower_dp.checks.check_arguments`): σ = 0 runs, without noise, stated as ε = ∞.

Unlike Flower's ``DifferentialPrivacyServerSideFixedClipping`` (which divides by the number of replies, lets FedAvg
weight them by ``num-examples`` and samples with ``random.sample``), the sensitivity C/m holds by construction and
strategies whose aggregate is not a mean are refused before the first message. Client-reported metrics are outside
ε: training returns none (ε, δ, releases and the noise std are logged and kept in ``privacy_metrics``); evaluation
is the inner strategy's, not covered. How to use it: docs/client_level_dp.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from functools import partial
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, PrivacyAccountant
from flwr.serverapp.exception import InconsistentMessageReplies
from flwr.serverapp.strategy import FedAvg, Strategy

from fl_app.core.choices import AccountantName, AmplifiedSampling
from fl_app.empty_rounds import EmptyRoundWatch
from fl_app.instructions import RecipeSpec
from fl_app.privacy import mechanisms as mech
from fl_app.privacy.ledger import SampledGaussianLedger, accountant_name
from fl_app.privacy.pipeline import mechanisms_for
from strategies.base import FederatedStrategy
from strategies.client_dp import PrivacyAccount, PrivacyBudget
from strategies.client_dp.clipping import FixedClipNorm
from strategies.client_dp.randomness import RunRandomness
from strategies.client_dp.releasing import RunReleases
from strategies.client_dp.sampling import AmplifiedSampler, fixed_denominator
from strategies.client_level_dp import ClientLevelDP
from strategies.flower_dp.checks import (
    NOISE_STREAM,
    SAMPLING_STREAM,
    UNIT_WEIGHT,
    check_arguments,
    check_inner_strategy,
    check_release_dir,
)
from strategies.flower_dp.logs import inner_round_lines_dropped, log_summary, privacy_record, warn_of_settings
from strategies.flower_dp.replies import (
    PlannedRound,
    causes,
    counts,
    forwarded_replies,
    global_model,
    population,
    released_model,
    screen_replies,
    with_unit_weight,
)

__all__ = ["NOISE_STREAM", "SAMPLING_STREAM", "UNIT_WEIGHT", "DPOverFlowerMean"]


class DPOverFlowerMean(ClientLevelDP):
    """Client-level (ε, δ)-DP rounds (DP-FedAvg; docs/client_level_dp.md) around a FedAvg-family ``strategy`` of
    Flower's: what ``ClientLevelDP(FedAdam(...), ...)`` builds. Every argument is checked here, before the first
    message (ValueError naming it; the privacy arguments by the rules of our strategies' ``privacy`` config).

    Parameters
    ----------
    strategy : flwr.serverapp.strategy.FedAvg
        FedAvg, FedAvgM, FedProx, FedAdam, FedYogi, FedAdagrad (or a subclass that does not override their
        aggregation) built with ``weighted_by_key=UNIT_WEIGHT``, ``fraction_train=1.0``,
        ``min_train_nodes <= num_clients``, ``min_available_nodes <= num_clients`` and the default
        ``train_metrics_aggr_fn``. Anything else is refused here, before the first message.
    num_clients : int
        The population M: the number of connected nodes, one client each (checked every round).
    sample_rate : float
        q in (0, 1]; m = qM is the fixed denominator (a whole number for ``sampling="fixed"``).
    clip_norm : float
        C > 0, the bound on each client update's global L2 norm.
    noise_multiplier : float
        σ ≥ 0; the released average carries N(0, (σC/m)²) noise per coordinate. σ = 0 releases it without noise:
        ε is ∞ from the first release on (as our strategies state it), and a ``max_epsilon`` stops before it.
    delta : float or None
        δ in (0, 1) at which ε is stated; None: 1/M (``privacy.delta``'s default).
    sampling : {"poisson", "fixed", "auto"}
        ``auto`` is Poisson.
    accountant : {"rdp", "prv", "pld"} or PrivacyAccountant
        Composition by name (``sampling="fixed"`` is accounted by RDP only), or an accountant with Flower's
        ``PrivacyAccountant`` interface (e.g. Flower's ``RdpAccountant``) configured for this run: population M and
        sampling method POISSON or NO_AMPLIFICATION (``sampling="poisson"``), WITHOUT_REPLACEMENT
        (``"fixed"``); ε is read from it at ``delta``. Flower's event needs σ > 0 and a whole m = qM: otherwise it
        is refused here.
    max_epsilon : float or None
        Budget guard: no round starts whose release would take ε above it.
    secure : bool
        True: sampling and noise come from the OS CSPRNG. False: from the seeded streams of ``seed`` (tests,
        simulation; private only while the seed stays secret).
    seed : int
        Seed of the streams when ``secure=False``.
    release_dir : str or Path or None
        Where the write-ahead release log (``releases.jsonl``) is kept. Releases an earlier run logged there are
        accounted into this wrapper's ledger when it is built (CSPRNG runs); a seeded run refuses such a directory
        (its rounds would draw the logged rounds' noise again).
    max_empty_rounds : int
        The run fails (``NoUpdateAcceptedError``) after this many rounds in a row with clients sampled and none of
        their updates accepted, each a noise-only release accounted in ε (fl_app/empty_rounds.py); 0 = never.
    """

    def __init__(
        self,
        strategy: Strategy,
        *,
        num_clients: int,
        sample_rate: float,
        clip_norm: float,
        noise_multiplier: float,
        delta: float | None = None,
        sampling: AmplifiedSampling | str = "poisson",
        accountant: AccountantName | PrivacyAccountant = "rdp",
        max_epsilon: float | None = None,
        secure: bool = True,
        seed: int = 0,
        release_dir: str | Path | None = None,
        max_empty_rounds: int = 3,
    ) -> None:
        Strategy.__init__(self)
        privacy = check_arguments(num_clients, sample_rate, clip_norm, noise_multiplier, delta, sampling, accountant,
                                  max_epsilon, secure, seed)  # fmt: skip
        check_inner_strategy(strategy, num_clients)
        self.strategy: FedAvg = strategy  # type: ignore[assignment]  (checked above)
        self.num_clients = int(num_clients)
        self.sample_rate = privacy.sample_rate
        self.clip_norm = privacy.clip_norm
        self.noise_multiplier = privacy.noise_multiplier
        self.delta = privacy.delta
        self.sampling: AmplifiedSampling = privacy.sampling  # type: ignore[assignment]  (checked above)
        self.max_epsilon = privacy.max_epsilon
        self.secure = bool(secure)
        self.seed = int(seed)
        #: The sampler and the random sources, our strategies' (``privacy.noise_stream=shared`` for seeded noise).
        self.random = RunRandomness(self.secure, self.seed, None, self.sampling, self.sample_rate)
        #: Who takes part (our strategies' sampler for Poisson and fixed-size sampling, over the M nodes).
        self.sampler = AmplifiedSampler(self.num_clients)
        #: m = qM, the fixed denominator of every round's average, as our strategies take it.
        self.expected_clients = fixed_denominator(self.sampling, self.sample_rate, self.num_clients)
        #: The per-coordinate std σC/m of the noise on the released average.
        self.noise_std = mech.gaussian_noise_std(self.noise_multiplier, self.clip_norm, self.expected_clients, "server")
        #: What the releases spend (:meth:`_budget`) and run.json's claim of it, as ours (client_dp/account.py).
        self.account = PrivacyAccount(self._budget(accountant), self.noise_multiplier, FixedClipNorm(self.clip_norm),
                                      self.clip_norm, self.sample_rate, self.expected_clients, "server")  # fmt: skip
        #: The accountant's name in the summary: rdp, prv, pld, flwr-rdp for Flower's, else its class.
        self.accountant_name = accountant_name(self.account.accountant)
        #: Why the budget guard stopped the run (None while it runs).
        self.stop_reason: str | None = None
        self.empty_rounds = EmptyRoundWatch(int(max_empty_rounds), "ClientLevelDP max_empty_rounds")
        #: Each released round's ε, δ, releases and noise std by round (training returns none: Flower prints those
        #: as the clients').
        self.privacy_metrics: dict[int, MetricRecord] = {}
        #: The last training round's reply counts (client-derived: kept here, never in a MetricRecord).
        self.last_round_counts: dict[str, Any] | None = None
        #: The write-ahead release log in ``release_dir`` (not logged without one): our strategies' policy object.
        directory = None if release_dir is None else Path(release_dir)
        self.releases = RunReleases(directory, seeded=not self.secure)
        self._account_earlier_releases()
        #: Rounds this wrapper has started (sent a sample to): the key k of the seeded streams of the next is k + 1.
        self.rounds_started = 0
        self._round: PlannedRound | None = None
        warn_of_settings(self.noise_multiplier, self.secure, self.seed)

    def _budget(self, accountant: AccountantName | PrivacyAccountant) -> PrivacyBudget:
        """Our ledger over ``accountant`` (a name or Flower's interface), composing the privacy events of our
        ``dense`` recipe's mechanisms (clip, then Gaussian noise) for each release, and the budget guard."""
        budget = PrivacyBudget(
            SampledGaussianLedger(self.delta, accountant, self.sampling, self.num_clients),
            mechanisms_for(RecipeSpec("dense")),
            noise_multiplier=self.noise_multiplier,
            sample_rate=self.sample_rate,
            max_epsilon=self.max_epsilon,
        )
        if not isinstance(accountant, str):  # Flower's event needs σ > 0 and a whole m = qM: find out now
            try:
                budget.projected_epsilon()
            except ValueError as exc:
                name = accountant_name(budget.accountant)
                raise ValueError(f"ClientLevelDP argument accountant={name}: {exc}") from None
        return budget

    @classmethod
    def wraps(cls, strategy: object) -> bool:
        """A Flower strategy that is not one of this project's (what it accepts of them: :func:`check_inner_strategy`,
        which refuses the others naming what is accepted)."""
        return isinstance(strategy, Strategy) and not isinstance(strategy, (FederatedStrategy, ClientLevelDP))

    # ----- The guarantee -----------------------------------------------------------------------------------------

    @property
    def randomness(self) -> str:
        """Where sampling and noise come from (the release log's ``randomness``)."""
        return "os-csprng" if self.secure else "seeded"

    def dp_guarantee(self) -> dict[str, Any]:
        """The guarantee of the models released so far and the mechanism's parameters: our strategies' ``run.json``
        claim (:meth:`strategies.client_dp.PrivacyAccount.claim`), and what the wrapper adds (the population, the
        noise's std, what is not covered)."""
        return {
            **self.account.claim(self.random),
            "sampling": self.sampling,
            "num_clients": self.num_clients,
            "noise_std": self.noise_std,
            "not_covered": "client-reported metrics (train replies' metrics are dropped; evaluation metrics)",
        }

    def __repr__(self) -> str:
        return f"ClientLevelDP({self.strategy!r}, q={self.sample_rate}, C={self.clip_norm}, σ={self.noise_multiplier})"

    def summary(self) -> None:
        """Log the DP settings, then the inner strategy's (:func:`strategies.flower_dp.logs.log_summary`)."""
        log_summary(
            self.sampling,
            self.sample_rate,
            self.num_clients,
            self.expected_clients,
            self.clip_norm,
            self.noise_multiplier,
            self.noise_std,
            self.accountant_name,
            self.delta,
            self.max_epsilon,
            str(self.randomness),
        )
        self.strategy.summary()

    # ----- Training ----------------------------------------------------------------------------------------------

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Check the population, guard the budget, sample the round's clients and send them the inner strategy's
        messages (only theirs). Raises ValueError, before any message, if the grid's nodes are not the M clients or
        the model has a non-floating tensor."""
        self._round = None
        if self.stop_reason is not None:
            log(INFO, "configure_train: round %d not started: %s", server_round, self.stop_reason)
            return []
        node_ids = population(grid, self.num_clients, wait=self.rounds_started == 0)
        keys, weights, dtypes = global_model(arrays)
        if (reason := self.releases.guard(self.account.budget, server_round)) is not None:
            self.stop_reason = reason
            log(WARNING, "configure_train: stopping before the round: %s", self.stop_reason)
            return []
        draw = self.rounds_started + 1
        positions = self.sampler.sample_clients(draw, self.random, partial(range, self.num_clients)).clients
        sampled = [node_ids[int(i)] for i in positions]
        # The inner strategy builds its messages for every node (fraction_train=1.0): its config, and its own state
        # (FedOpt's and FedAvgM's current arrays) follow the round; only the sampled nodes' messages are sent.
        by_node: dict[int, Message] = {}
        with inner_round_lines_dropped():  # its "Sampled M nodes" is not who is sent one
            built = list(self.strategy.configure_train(server_round, arrays, config, grid))
        for message in built:
            node = int(message.metadata.dst_node_id)
            if node in by_node:
                raise RuntimeError(f"{type(self.strategy).__name__}.configure_train addressed node {node} twice")
            by_node[node] = message
        if missing := [node for node in sampled if node not in by_node]:
            raise RuntimeError(
                f"{type(self.strategy).__name__}.configure_train built no message for sampled nodes {missing}"
            )
        messages = tuple(by_node[node] for node in sampled)
        self.rounds_started = draw
        self._round = PlannedRound(server_round, draw, keys, weights, dtypes, messages)
        log(INFO, "configure_train: %d of %d clients sampled (%s, q=%s)", len(messages), self.num_clients,
            self.sampling, self.sample_rate)  # fmt: skip
        return list(messages)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Bind and screen the replies, clip, release w + (1/m)ΣΔ̃ + Z through the inner strategy's mean, log the
        release ahead, account it, and return the inner strategy's result and no metrics: the round's ε is logged
        and kept in :attr:`privacy_metrics`, the clients' metrics are dropped.

        A round that configure_train did not start (budget guard) releases nothing: (None, None)."""
        replies = list(replies)
        planned, self._round = self._round, None
        if planned is None or planned.server_round != server_round:
            self.last_round_counts = counts(0, 0, len(replies), 0, Counter(unbound=len(replies)))
            if replies:
                log(WARNING, "aggregate_train: round %d was not started; %d replies ignored", server_round,
                    len(replies))  # fmt: skip
            return None, None
        accepted, rejected, answered = screen_replies(planned, replies, self.clip_norm)
        self.last_round_counts = counts(len(planned.messages), answered, len(replies), len(accepted), rejected)
        log(INFO, "aggregate_train: %d replies accepted, %d rejected, %d missing", len(accepted),
            sum(rejected.values()), len(planned.messages) - answered)  # fmt: skip

        # One draw Z ~ N(0, (σC/m)²) for the round, on every forwarded reply: the inner mean passes it through.
        rng = self.random.noise_rng(planned.draw, NOISE_STREAM)
        zeros = [np.zeros(w.shape, dtype=np.float64) for w in planned.global_weights]
        noise = mech.add_gaussian_noise(zeros, self.noise_std, rng)
        # The inner strategy's unweighted mean of these is w + (1/m) ΣΔ̃ + Z, over the fixed m whoever answered.
        forwarded = forwarded_replies(self.strategy.arrayrecord_key, planned, accepted, noise, self.expected_clients)
        with inner_round_lines_dropped():  # its "Received n results" counts the forwarded replies
            aggregated, _client_metrics = self.strategy.aggregate_train(server_round, forwarded)
        released = released_model(aggregated, planned)

        # Written ahead and accounted: the model leaves the server only after its log line is durable.
        self.releases.release(self.account.budget, server_round, released.to_numpy_ndarrays(), self.secure)
        epsilon = self.epsilon()
        log(INFO, "aggregate_train: released round %d, epsilon=%.4f at delta=%g after %d releases", server_round,
            epsilon, self.delta, self.rounds_released)  # fmt: skip
        # After the release is logged and accounted: a run in which nobody trains fails, with its ε stated.
        self.empty_rounds.observe(server_round, len(planned.messages), len(accepted), causes(self.last_round_counts))
        # Not in the train MetricRecord, which Flower's start() prints as the ClientApp-side metrics.
        self.privacy_metrics[server_round] = privacy_record(epsilon, self.delta, self.rounds_released, self.noise_std)
        return released, None

    # ----- Evaluation: the inner strategy's, outside ε -----------------------------------------------------------

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The inner strategy's evaluation round. Its nodes and metrics are outside ε: client-reported evaluation
        metrics are not covered by the guarantee (as Flower's DP wrappers say of theirs)."""
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The inner strategy's aggregate of the evaluation metrics (NOT covered by ε), each reply given the unit
        weight (clients do not report it): an unweighted mean. Inconsistent replies skip it (None), never crash."""
        forwarded = [reply if reply.has_error() else with_unit_weight(reply) for reply in replies]
        try:
            return self.strategy.aggregate_evaluate(server_round, forwarded)
        except InconsistentMessageReplies as exc:
            log(WARNING, "aggregate_evaluate: round %d skipped: %s", server_round, exc)
            return None

    def _account_earlier_releases(self) -> None:
        """Every model an earlier run logged in ``release_dir`` left the server and is spent, whichever run released
        it (as a resumed run of ours accounts the releases logged after its checkpoint); a seeded run refuses them."""
        if not self.releases.logged:
            return
        assert self.releases.log is not None
        check_release_dir(self.releases.log.path.parent, self.releases.logged, self.secure)
        owed = self.releases.resume(self.account.budget, 0, 0)
        log(WARNING, "ClientLevelDP: accounted %d earlier releases logged in %s (epsilon=%.4f)", len(owed),
            self.releases.log.path.parent, self.epsilon())  # fmt: skip
