"""Client-level (ε, δ)-DP as a wrapper around Flower's own FedAvg-family strategies (DP-FedAvg: McMahan, Ramage,
Talwar, Zhang, "Learning Differentially Private Recurrent Language Models", ICLR 2018).

:class:`ClientLevelDP` wraps a ``flwr.serverapp.strategy.FedAvg`` (or FedAvgM, FedProx, FedAdam, FedYogi,
FedAdagrad) and makes every training round the sampled Gaussian mechanism that this project accounts, as pinned down
by ``SPEC.md``:

- §1 sampling: the wrapper draws the round's clients itself — Poisson(q) over the M connected nodes (one client a
  node), or exactly m = qM of them without replacement — from the OS CSPRNG (``secure=True``) or the seeded stream
  (seed, k, :data:`SAMPLING_STREAM`) of the k-th round the wrapper starts; the inner strategy only builds the
  messages (its config goes along, e.g. FedProx's ``proximal-mu``), and the wrapper sends those addressed to the
  sampled nodes.
- §2 the mechanism: each accepted reply's update Δ_i = trained − global (float64) is clipped to global L2 norm C,
  and the round releases w + (1/m) Σ_i Δ̃_i + Z with Z ~ N(0, (σC/m)²·I) over the FIXED denominator m = qM, whoever
  answered. The wrapper obtains it *through the inner strategy's own mean*: it hands the inner strategy n replies
  w + (n/m)·Δ̃_i + Z (the same Z on each) of unit weight, whose unweighted mean is exactly
  w + (1/m) Σ Δ̃_i + Z (with no accepted reply, one synthetic reply w + Z: the noise is released whoever answers).
  Whatever the inner strategy does with that mean afterwards (FedAdam's Adam step on the pseudo-gradient, FedAvgM's
  momentum) is post-processing. Its result is cast back to the model's dtypes.
- §7 accounting: each release is written ahead to ``release_dir``'s release log (:mod:`fl_app.releases`), then
  accounted in a :class:`~fl_app.privacy.ledger.SampledGaussianLedger` (RDP/PRV/PLD for Poisson, the
  without-replacement RDP event for fixed-size sampling), and only then returned; the budget guard stops before the
  round that would pass ``max_epsilon``.

The guarantee is ours, not Flower's ``DifferentialPrivacyServerSideFixedClipping``'s: that wrapper divides by the
number of replies, lets FedAvg weight them by ``num-examples`` and samples with ``random.sample``; here the
sensitivity C/m holds by construction and strategies whose aggregate is not a mean are refused before the first
message. Client-reported metrics (train and evaluate) are outside ε: the training round publishes only
non-client-derived metrics (ε, δ, rounds, the noise std); evaluation is delegated to the inner strategy and its
metrics are, as Flower's wrapper says of its own, not covered.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.exception import InconsistentMessageReplies
from flwr.serverapp.strategy import FedAvg, Strategy

from fl_app.core.choices import AccountantName, AmplifiedSampling
from fl_app.privacy import mechanisms as mech
from fl_app.privacy.ledger import SampledGaussianLedger
from fl_app.releases import Release, ReleaseLog, model_digest

__all__ = ["NOISE_STREAM", "SAMPLING_STREAM", "UNIT_WEIGHT", "ClientLevelDP"]

from strategies.flower_dp.checks import (
    NOISE_STREAM,
    REJECTION_REASONS,
    SAMPLING_STREAM,
    UNIT_WEIGHT,
    _check_arguments,
    check_inner_strategy,
)


@dataclass(frozen=True)
class _Round:
    """What configure_train sent in a round, for aggregate_train to bind the replies to."""

    server_round: int
    draw: int  # k: the key of the round's seeded streams
    keys: tuple[str, ...]
    global_weights: tuple[np.ndarray, ...]  # float64 copies, in ``keys`` order
    dtypes: tuple[np.dtype, ...]  # the model's dtypes, which the released model keeps
    messages: tuple[Message, ...]  # one per sampled node; the grid sets their ids on push


class ClientLevelDP(Strategy):
    """Client-level (ε, δ)-DP training rounds (DP-FedAvg; SPEC §1, §2, §7) around a FedAvg-family ``strategy``.

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
        σ > 0; the released average carries N(0, (σC/m)²) noise per coordinate.
    delta : float
        δ in (0, 1) at which ε is stated.
    sampling : {"poisson", "fixed"}
    accountant : {"rdp", "prv", "pld"}
        Composition; ``sampling="fixed"`` is accounted by RDP only.
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
    """

    def __init__(
        self,
        strategy: Strategy,
        *,
        num_clients: int,
        sample_rate: float,
        clip_norm: float,
        noise_multiplier: float,
        delta: float,
        sampling: AmplifiedSampling = "poisson",
        accountant: AccountantName = "rdp",
        max_epsilon: float | None = None,
        secure: bool = True,
        seed: int = 0,
        release_dir: str | Path | None = None,
    ) -> None:
        super().__init__()
        _check_arguments(num_clients, sample_rate, clip_norm, noise_multiplier, delta, sampling, accountant,
                         max_epsilon, secure, seed)  # fmt: skip
        check_inner_strategy(strategy, num_clients)
        self.strategy: FedAvg = strategy  # type: ignore[assignment]  (checked above)
        self.num_clients = int(num_clients)
        self.sample_rate = float(sample_rate)
        self.clip_norm = float(clip_norm)
        self.noise_multiplier = float(noise_multiplier)
        self.delta = float(delta)
        self.sampling: AmplifiedSampling = sampling
        self.accountant_name: AccountantName = accountant
        self.max_epsilon = None if max_epsilon is None else float(max_epsilon)
        self.secure = bool(secure)
        self.seed = int(seed)
        #: m = qM, the fixed denominator of every round's average (not rounded: SPEC §1).
        self.expected_clients = mech.expected_clients(self.num_clients, self.sample_rate)
        #: The per-coordinate std σC/m of the noise on the released average.
        self.noise_std = mech.gaussian_noise_std(self.noise_multiplier, self.clip_norm, self.expected_clients, "server")
        self.ledger = SampledGaussianLedger(self.delta, accountant, sampling, self.num_clients)
        #: Why the budget guard stopped the run (None while it runs).
        self.stop_reason: str | None = None
        #: The last training round's reply counts (client-derived: kept here, never in a MetricRecord).
        self.last_round_counts: dict[str, Any] | None = None
        self.release_log: ReleaseLog | None = None
        if release_dir is not None:
            self.release_log = self._open_release_log(Path(release_dir))
        #: Rounds this wrapper has started (sent a sample to): the key k of the seeded streams of the next is k + 1.
        self.rounds_started = 0
        self._round: _Round | None = None
        if not self.secure:
            log(WARNING, "ClientLevelDP: seeded sampling and noise (seed=%d): private only while the seed stays "
                         "secret; use secure=True outside tests and simulations", self.seed)  # fmt: skip

    # ------------------------------------------------------------------------------------------------------------
    # The guarantee
    # ------------------------------------------------------------------------------------------------------------

    @property
    def randomness(self) -> str:
        """Where sampling and noise come from (the release log's ``randomness``)."""
        return "os-csprng" if self.secure else "seeded"

    @property
    def rounds_released(self) -> int:
        """Noisy models released (and accounted), earlier releases logged in ``release_dir`` included."""
        return self.ledger.rounds

    def epsilon(self) -> float:
        """ε spent so far at δ."""
        return self.ledger.epsilon()

    def dp_guarantee(self) -> dict[str, Any]:
        """The guarantee of the models released so far, and the mechanism's parameters."""
        claim = self.ledger.claim()
        return {
            "statement": claim["statement"],
            "epsilon": claim["epsilon"],
            "delta": self.delta,
            "rounds": self.rounds_released,
            "accountant": self.accountant_name,
            "sampling": self.sampling,
            "sampling_event": claim["sampling_event"],
            "neighbouring": claim["neighbouring"],
            "sample_rate": self.sample_rate,
            "num_clients": self.num_clients,
            "noise_multiplier": self.noise_multiplier,
            "clip_norm": self.clip_norm,
            "expected_clients": self.expected_clients,
            "noise_std": self.noise_std,
            "randomness": self.randomness,
            "not_covered": "client-reported metrics (train replies' metrics are dropped; evaluation metrics)",
        }

    def __repr__(self) -> str:
        return f"ClientLevelDP({self.strategy!r}, q={self.sample_rate}, C={self.clip_norm}, σ={self.noise_multiplier})"

    def summary(self) -> None:
        """Log the DP settings, then the inner strategy's."""
        log(INFO, "\t├──> Client-level DP (DP-FedAvg, SPEC §1, §2, §7):")
        log(INFO, "\t│\t├── sampling: %s, q=%s over M=%d clients, m=qM=%s", self.sampling, self.sample_rate,
            self.num_clients, self.expected_clients)  # fmt: skip
        log(INFO, "\t│\t├── clip norm C=%s, noise multiplier σ=%s (std σC/m=%.4g)", self.clip_norm,
            self.noise_multiplier, self.noise_std)  # fmt: skip
        log(INFO, "\t│\t├── accountant %s at δ=%g; max ε: %s", self.accountant_name, self.delta, self.max_epsilon)
        log(INFO, "\t│\t└── randomness: %s", self.randomness)
        self.strategy.summary()

    # ------------------------------------------------------------------------------------------------------------
    # Training
    # ------------------------------------------------------------------------------------------------------------

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
        node_ids = self._population(grid)
        keys, weights, dtypes = _global_model(arrays)
        if self.max_epsilon is not None:
            projected = self.ledger.projected_epsilon(self.noise_multiplier, self.sample_rate)
            if projected > self.max_epsilon:
                self.stop_reason = (
                    f"budget: round {server_round} would take epsilon from {self.epsilon():.4g} to {projected:.4g}, "
                    f"above max_epsilon={self.max_epsilon:g}"
                )
                log(WARNING, "configure_train: stopping before the round: %s", self.stop_reason)
                return []
        draw = self.rounds_started + 1
        rng = mech.random_source(self.secure, self.seed, draw, SAMPLING_STREAM)
        if self.sampling == "fixed":
            positions = mech.fixed_size_sample(self.num_clients, round(self.expected_clients), rng)
        else:
            positions = mech.poisson_sample(self.num_clients, self.sample_rate, rng)
        sampled = [node_ids[int(i)] for i in positions]
        # The inner strategy builds its messages for every node (fraction_train=1.0): its config, and its own state
        # (FedOpt's and FedAvgM's current arrays) follow the round; only the sampled nodes' messages are sent.
        by_node: dict[int, Message] = {}
        for message in self.strategy.configure_train(server_round, arrays, config, grid):
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
        self._round = _Round(server_round, draw, keys, weights, dtypes, messages)
        log(INFO, "configure_train: %d of %d clients sampled (%s, q=%s)", len(messages), self.num_clients,
            self.sampling, self.sample_rate)  # fmt: skip
        return list(messages)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Bind and screen the replies, clip, release w + (1/m)ΣΔ̃ + Z through the inner strategy's mean, log the
        release ahead, account it, and return the inner strategy's result with non-client-derived metrics only.

        A round that configure_train did not start (budget guard) releases nothing: (None, None)."""
        replies = list(replies)
        planned, self._round = self._round, None
        if planned is None or planned.server_round != server_round:
            self.last_round_counts = _counts(0, 0, len(replies), 0, Counter(unbound=len(replies)))
            if replies:
                log(WARNING, "aggregate_train: round %d was not started; %d replies ignored", server_round,
                    len(replies))  # fmt: skip
            return None, None
        accepted, rejected, answered = self._screen(planned, replies)
        self.last_round_counts = _counts(len(planned.messages), answered, len(replies), len(accepted), rejected)
        log(INFO, "aggregate_train: %d replies accepted, %d rejected, %d missing", len(accepted),
            sum(rejected.values()), len(planned.messages) - answered)  # fmt: skip

        # One draw Z ~ N(0, (σC/m)²) for the round, on every forwarded reply: the inner mean passes it through.
        rng = mech.random_source(self.secure, self.seed, planned.draw, NOISE_STREAM)
        zeros = [np.zeros(w.shape, dtype=np.float64) for w in planned.global_weights]
        noise = mech.add_gaussian_noise(zeros, self.noise_std, rng)
        noisy_global = [w + z for w, z in zip(planned.global_weights, noise, strict=True)]
        scale = len(accepted) / self.expected_clients  # n/m: the inner mean's 1/n becomes the fixed 1/m
        forwarded = [
            self._forward(planned.keys, [b + scale * d for b, d in zip(noisy_global, update, strict=True)], sent)
            for sent, update in accepted
        ]
        if not forwarded:  # nobody sampled or accepted: the round still releases w + Z
            forwarded.append(self._forward(planned.keys, noisy_global, None))
        aggregated, _client_metrics = self.strategy.aggregate_train(server_round, forwarded)
        released = _released_model(aggregated, planned)

        digest = model_digest(released.to_numpy_ndarrays())
        if self.release_log is not None:  # written ahead: the model leaves the server only after this line is durable
            self.release_log.append(
                Release(server_round, self.noise_multiplier, self.sample_rate, self.randomness, digest)
            )
        self.ledger.step(self.noise_multiplier, self.sample_rate)
        epsilon = self.epsilon()
        log(INFO, "aggregate_train: released round %d, epsilon=%.4f at delta=%g after %d releases", server_round,
            epsilon, self.delta, self.rounds_released)  # fmt: skip
        metrics = MetricRecord({
            "dp-epsilon": float(epsilon),
            "dp-delta": self.delta,
            "dp-rounds-released": int(self.rounds_released),
            "dp-noise-std": float(self.noise_std),
        })  # fmt: skip
        return released, metrics

    # ------------------------------------------------------------------------------------------------------------
    # Evaluation: the inner strategy's, outside ε
    # ------------------------------------------------------------------------------------------------------------

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The inner strategy's evaluation round. Its nodes and metrics are outside ε: client-reported evaluation
        metrics are not covered by the guarantee (as Flower's DP wrappers say of theirs)."""
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The inner strategy's aggregate of the evaluation metrics (NOT covered by ε), each reply given the unit
        weight (clients do not report it): an unweighted mean. Inconsistent replies skip it (None), never crash."""
        forwarded = [reply if reply.has_error() else _with_unit_weight(reply) for reply in replies]
        try:
            return self.strategy.aggregate_evaluate(server_round, forwarded)
        except InconsistentMessageReplies as exc:
            log(WARNING, "aggregate_evaluate: round %d skipped: %s", server_round, exc)
            return None

    # ------------------------------------------------------------------------------------------------------------
    # Internals
    # ------------------------------------------------------------------------------------------------------------

    def _open_release_log(self, directory: Path) -> ReleaseLog:
        directory.mkdir(parents=True, exist_ok=True)
        release_log = ReleaseLog(directory)
        earlier = release_log.read()
        if earlier and not self.secure:
            raise ValueError(
                f"release_dir {directory} already logs {len(earlier)} releases: a seeded run would draw their noise "
                "again (two models whose difference is noise-free, which no accountant covers); use an empty "
                "release_dir, or secure=True"
            )
        for release in earlier:  # every model that left the server is spent, whichever run released it
            self.ledger.step(release.noise_multiplier, release.sample_rate)
        if earlier:
            log(WARNING, "ClientLevelDP: accounted %d earlier releases logged in %s (epsilon=%.4f)", len(earlier),
                directory, self.epsilon())  # fmt: skip
        return release_log

    def _population(self, grid: Grid) -> list[int]:
        node_ids = sorted({int(node) for node in grid.get_node_ids()})
        if len(node_ids) != self.num_clients:
            raise ValueError(
                f"ClientLevelDP samples its clients among num_clients={self.num_clients} nodes (one client each), but "
                f"the grid has {len(node_ids)} connected nodes: sampling over another population breaks the "
                "accounted sampling rate; no message was sent"
            )
        return node_ids

    def _screen(
        self, planned: _Round, replies: list[Message]
    ) -> tuple[list[tuple[Message, list[np.ndarray]]], Counter[str], int]:
        """(accepted (message, clipped update) pairs, rejections by reason, messages answered)."""
        sent = {m.metadata.message_id: m for m in planned.messages if m.metadata.message_id}
        answered: set[str] = set()
        rejected: Counter[str] = Counter()
        accepted: list[tuple[Message, list[np.ndarray]]] = []
        for reply in replies:
            reply_to = reply.metadata.reply_to_message_id
            message = sent.get(reply_to)
            if message is None or reply.metadata.src_node_id != message.metadata.dst_node_id:
                rejected["unbound"] += 1  # not a reply to this round's messages, or not from the node it went to
                continue
            if reply_to in answered:
                rejected["duplicate"] += 1  # a message is answered once: the first reply binds
                continue
            answered.add(reply_to)
            if reply.has_error():
                rejected["error"] += 1
                continue
            update, reason = self._clipped_update(reply, planned)
            if update is None:
                rejected[reason] += 1
                continue
            accepted.append((message, update))
        return accepted, rejected, len(answered)

    def _clipped_update(self, reply: Message, planned: _Round) -> tuple[list[np.ndarray] | None, str]:
        """(Δ̃ = clip(trained − global, C) in float64, "") or (None, why the reply is rejected)."""
        if not reply.has_content():
            return None, "malformed"
        records = list(reply.content.array_records.values())
        if len(records) != 1:
            return None, "malformed"
        (record,) = records
        if set(record.keys()) != set(planned.keys):
            return None, "shape"
        update: list[np.ndarray] = []
        for key, weights in zip(planned.keys, planned.global_weights, strict=True):
            try:
                trained = np.asarray(record[key].numpy())
            except Exception:  # undecodable bytes, a non-numpy serialisation: the client's fault, never a crash
                return None, "malformed"
            if trained.shape != weights.shape:
                return None, "shape"
            if not (np.issubdtype(trained.dtype, np.floating) or np.issubdtype(trained.dtype, np.integer)):
                return None, "malformed"
            with np.errstate(over="ignore", invalid="ignore"):  # inf − inf and overflows are screened just below
                update.append(trained.astype(np.float64) - weights)
        # The screening every reply gets (NaN/Inf anywhere, or finite entries whose norm overflows).
        if mech.measure_update(update, [w.shape for w in planned.global_weights])[0] is not None:
            return None, "nonfinite"
        clipped, _norm = mech.clip_update(update, self.clip_norm)
        return clipped, ""

    def _forward(self, keys: tuple[str, ...], arrays: list[np.ndarray], sent: Message | None) -> Message:
        """A reply for the inner strategy: the arrays and the unit weight, nothing the client reported."""
        content = RecordDict({
            self.strategy.arrayrecord_key: ArrayRecord({k: Array(a) for k, a in zip(keys, arrays, strict=True)}),
            "metrics": MetricRecord({UNIT_WEIGHT: 1}),
        })  # fmt: skip
        if sent is None:  # the synthetic reply of a round with no accepted reply
            return Message(content, dst_node_id=0, message_type=MessageType.TRAIN)
        return Message(content, reply_to=sent)


# ----------------------------------------------------------------------------------------------------------------
# Refusals (before the first message)
# ----------------------------------------------------------------------------------------------------------------


def _global_model(arrays: ArrayRecord) -> tuple[tuple[str, ...], tuple[np.ndarray, ...], tuple[np.dtype, ...]]:
    """The global model's keys, float64 copies and dtypes; ValueError for a tensor the mechanism cannot noise."""
    keys = tuple(arrays.keys())
    if not keys:
        raise ValueError("ClientLevelDP needs a model: the ArrayRecord to train is empty")
    tensors = [np.asarray(arrays[key].numpy()) for key in keys]
    for key, tensor in zip(keys, tensors, strict=True):
        if not np.issubdtype(tensor.dtype, np.floating):
            raise ValueError(
                f"array {key!r} has dtype {tensor.dtype}: every released tensor gets Gaussian noise, so the model "
                "must be floating point (keep integer buffers out of the trained ArrayRecord)"
            )
    return keys, tuple(t.astype(np.float64) for t in tensors), tuple(t.dtype for t in tensors)


def _released_model(aggregated: ArrayRecord | None, planned: _Round) -> ArrayRecord:
    """The inner strategy's result in the model's keys, shapes and dtypes (a cast is post-processing)."""
    if aggregated is None or set(aggregated.keys()) != set(planned.keys):
        raise RuntimeError("the inner strategy did not aggregate the forwarded replies into the model's arrays")
    released: dict[str, Array] = {}
    for key, weights, dtype in zip(planned.keys, planned.global_weights, planned.dtypes, strict=True):
        tensor = np.asarray(aggregated[key].numpy())
        if tensor.shape != weights.shape:
            raise RuntimeError(f"the inner strategy returned array {key!r} with shape {tensor.shape}")
        released[key] = Array(np.ascontiguousarray(tensor.astype(dtype)))
    return ArrayRecord(released)


def _with_unit_weight(reply: Message) -> Message:
    """An evaluation reply whose MetricRecords carry the unit weight the inner strategy averages by."""
    content = RecordDict()
    for key, record in reply.content.items():
        content[key] = MetricRecord({**record, UNIT_WEIGHT: 1}) if isinstance(record, MetricRecord) else record
    return Message(content=content, metadata=reply.metadata)


def _counts(sampled: int, answered: int, replies: int, accepted: int, rejected: Counter[str]) -> dict[str, Any]:
    return {
        "sampled": sampled,
        "replies": replies,
        "accepted": accepted,
        "missing": sampled - answered,
        "rejected": {reason: int(rejected.get(reason, 0)) for reason in REJECTION_REASONS},
    }
