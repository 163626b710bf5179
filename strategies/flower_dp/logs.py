"""What ClientLevelDP prints and publishes, so that no line of the inner strategy's contradicts its own.

- The inner strategy builds a train message for every node (``fraction_train=1.0``) and then averages the replies
  the wrapper forwards to it; its own lines for those two steps (``configure_train: Sampled M nodes (out of M)``,
  ``aggregate_train: Received n results and 0 failures``) would sit next to the wrapper's ``k of M clients
  sampled`` and ``a replies accepted, r rejected, x missing`` and say otherwise: :func:`inner_round_lines_dropped`
  drops exactly those two records while the wrapper calls the inner strategy, in that thread only. The inner
  strategy's evaluation lines stay: its evaluation is its own.
- `log_summary` states the sampling once: the inner strategy's ``Fraction: train (1.00)`` that follows it is the
  messages it builds, not who is sent one.
- :func:`privacy_record` is a released round's ε, δ, releases and noise std: the wrapper keeps it in
  ``privacy_metrics``, not in the train MetricRecord that Flower's ``Strategy.start`` labels "ClientApp-side".
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from logging import INFO, WARNING

from flwr.app import MetricRecord
from flwr.common.logger import log

#: The format strings of the inner strategy's own per-round training lines (Flower 1.42's ``FedAvg``).
INNER_SAMPLED = "configure_train: Sampled %s nodes (out of %s)"
INNER_RECEIVED = "%s: Received %s results and %s failures"


class _InnerRoundLines(logging.Filter):
    """Drops the inner strategy's sampling and received-replies lines of training, logged from one thread."""

    def __init__(self, thread: int) -> None:
        super().__init__()
        self.thread = thread

    def filter(self, record: logging.LogRecord) -> bool:
        if record.thread != self.thread:
            return True
        if record.msg == INNER_SAMPLED:
            return False
        return not (record.msg == INNER_RECEIVED and record.args and record.args[0] == "aggregate_train")


@contextlib.contextmanager
def inner_round_lines_dropped() -> Iterator[None]:
    """While the block runs, Flower's logger drops the inner strategy's training lines logged by this thread."""
    logger = logging.getLogger("flwr")
    dropped = _InnerRoundLines(threading.get_ident())
    logger.addFilter(dropped)
    try:
        yield
    finally:
        logger.removeFilter(dropped)


def log_summary(sampling: str, sample_rate: float, num_clients: int, expected_clients: float, clip_norm: float,
            noise_multiplier: float, noise_std: float, accountant: str, delta: float, max_epsilon: float | None,
            randomness: str) -> None:  # fmt: skip
    """Log the DP settings (the wrapper then logs the inner strategy's), the sampling stated once as ours."""
    log(INFO, "\t├──> Client-level DP (DP-FedAvg, docs/client_level_dp.md):")
    log(INFO, "\t│\t├── sampling: %s, q=%s over M=%d clients, m=qM=%s, drawn by ClientLevelDP (the inner "
        "strategy's train fraction below builds a message for every node; only the sampled ones are sent)",
        sampling, sample_rate, num_clients, expected_clients)  # fmt: skip
    log(INFO, "\t│\t├── clip norm C=%s, noise multiplier σ=%s (std σC/m=%.4g)", clip_norm, noise_multiplier,
        noise_std)  # fmt: skip
    log(INFO, "\t│\t├── accountant %s at δ=%g; max ε: %s", accountant, delta, max_epsilon)
    log(INFO, "\t│\t└── randomness: %s", randomness)


def privacy_record(epsilon: float, delta: float, rounds_released: int, noise_std: float) -> MetricRecord:
    """A released round's guarantee and noise: nothing a client reported."""
    return MetricRecord({
        "dp-epsilon": float(epsilon),
        "dp-delta": float(delta),
        "dp-rounds-released": int(rounds_released),
        "dp-noise-std": float(noise_std),
    })  # fmt: skip


def warn_of_settings(noise_multiplier: float, secure: bool, seed: int) -> None:
    """Say what the settings give up: no noise (σ = 0), or seeded randomness."""
    if noise_multiplier == 0:
        log(WARNING, "ClientLevelDP: noise_multiplier=0: the rounds are released without noise (epsilon = inf)")
    if not secure:
        log(WARNING, "ClientLevelDP: seeded sampling and noise (seed=%d): private only while the seed stays "
                     "secret; use secure=True outside tests and simulations", seed)  # fmt: skip
