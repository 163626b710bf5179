"""How weak a mechanism the canary audit catches: deliberate weakenings, set up here in the tests only.

Each weakening patches one function of :mod:`fl_app.privacy.mechanisms` for the length of a run, as a refactor that
broke it would, while the accountant keeps counting the correct mechanism:

- ``noise x0.5`` / ``noise x0.25``: the Gaussian noise's std is half / a quarter of σ·C/m;
- ``noise on one tensor``: the noise is added to the first weight tensor only (15,000 of the 20,000 weights);
  ``noise on the small tensor``: to the second only (5,000 of 20,000);
- ``clip skipped (client path)``: in client placement (fixed-size sampling; the server does not clip again) the
  client's clip is skipped; the canaries claim an update of 10·C (``audit.canary_scale=10``), which only that clip
  holds to C;
- ``sampling 2x``: the round's sampler takes each client with probability 2q (the canaries are drawn by the same
  code, strategies/base.py ``sample``); also at q = 0.25 (2q = 0.5), where doubling costs more privacy.

The runs are the real ``start()`` loop (strategies/base.py) on a fake grid whose clients send a zero update through
the real client path (:class:`ClientPathGrid`: clip, and in client placement their noise) and a model of d = 20,000
weights (:data:`SHAPES`): the released rounds are the mechanism acting on the canaries alone.
The configuration is CPU Table IV's privacy (M = 100, q = 0.1, σ = 0.95, C = 0.05, δ = 0.01, 12 rounds, Poisson,
RDP; accountant ε = 1.66). ``python -m tests.audit.power`` prints the power table of docs/audit.md;
tests/audit/test_power.py checks the same weakenings at one seed.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, Message

from clients.recipes import privatize_update
from fl_app.audit.canaries import AuditResult
from fl_app.core.choices import GUESS_RULES
from fl_app.instructions import TrainInstructions
from fl_app.privacy import mechanisms as mech
from tests.helpers import FakeGrid, build, partition_of, reply, zeros

SHAPES: list[tuple[int, ...]] = [(100, 150), (5000,)]  # d = 20,000
#: CPU Table IV's privacy (conf/scale/cpu.yaml) on the fake grid.
TABLE4 = (
    "strategy=dp_fedavg", "dataset.num_clients=100", "privacy.sample_rate=0.1", "privacy.noise_multiplier=0.95",
    "privacy.clip_norm=0.05", "privacy.delta=0.01", "audit=canaries",
)  # fmt: skip
ROUNDS = 12


class ClientPathGrid(FakeGrid):
    """Every sampled client sends a zero update through the real client path (clients/recipes.py): in client
    placement that is where the noise is added (a grid of bare zero replies would leave the round without it)."""

    def send_and_receive(self, messages: Any, timeout: float | None = None) -> list[Message]:
        messages = list(messages)
        for i, msg in enumerate(messages):
            msg.metadata.__dict__["_message_id"] = f"c{len(self.sent)}-{i}"
        self.sent.append([])
        replies = []
        for msg in messages:
            pid = partition_of(msg)
            self.sent[-1].append(pid)
            sent, _ = privatize_update(zeros(SHAPES), TrainInstructions.from_config(msg.content["config"]), pid)
            replies.append(reply(pid, sent, pre_clip_norm=0.0, to=msg))
        return replies


@contextlib.contextmanager
def _patched(name: str, replacement: Callable[..., object]) -> Iterator[None]:
    # Patched where every caller outside the package reads it, and in the submodule that defines it, where the
    # package's own callers read it (reclip → clip_update, client_noise_topup_std → gaussian_noise_std).
    defining = sys.modules[getattr(mech, name).__module__]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mech, name, replacement)
        patch.setattr(defining, name, replacement)
        yield


def noise_scaled(factor: float) -> contextlib.AbstractContextManager[None]:
    real = mech.gaussian_noise_std
    return _patched("gaussian_noise_std", lambda *args, **kwargs: factor * real(*args, **kwargs))


def noise_on_one_tensor(which: int) -> contextlib.AbstractContextManager[None]:
    """The noise is added to tensor ``which`` of the update only; the others go out as they came."""
    real = mech.add_gaussian_noise

    def one_only(update: list[np.ndarray], std: float, rng: mech.NormalSource) -> list[np.ndarray]:
        out = [np.array(u) for u in update]
        out[which] = real([update[which]], std, rng)[0]
        return out

    return _patched("add_gaussian_noise", one_only)


def clip_skipped() -> contextlib.AbstractContextManager[None]:
    return _patched("clip_update", lambda update, clip_norm: ([np.array(u) for u in update], 0.0))


def sampling_doubled() -> contextlib.AbstractContextManager[None]:
    real = mech.poisson_sample
    return _patched("poisson_sample", lambda n, q, rng: real(n, min(1.0, 2 * q), rng))


@dataclass(frozen=True)
class Weakening:
    name: str
    patch: Callable[[], contextlib.AbstractContextManager[None]]
    overrides: tuple[str, ...] = ()


WEAKENINGS = {
    w.name: w
    for w in (
        Weakening("none (correct mechanism)", contextlib.nullcontext),
        Weakening("noise x0.5", lambda: noise_scaled(0.5)),
        Weakening("noise x0.25", lambda: noise_scaled(0.25)),
        Weakening("noise on one tensor", lambda: noise_on_one_tensor(0)),
        Weakening("noise on the small tensor", lambda: noise_on_one_tensor(1)),
        Weakening(
            "clip skipped (client path)",
            clip_skipped,
            ("privacy.placement=client", "privacy.sampling=fixed", "audit.canary_scale=10"),
        ),
        Weakening("sampling 2x", sampling_doubled),
        Weakening("sampling 2x, q = 0.25", sampling_doubled, ("privacy.sample_rate=0.25",)),
    )
}
CORRECT = WEAKENINGS["none (correct mechanism)"]
#: The correct mechanism, with the client-path weakening's settings (its own baseline).
CORRECT_CLIENT_PATH = Weakening(
    "none, client placement", contextlib.nullcontext, WEAKENINGS["clip skipped (client path)"].overrides
)
#: The correct mechanism at the sampling rate of the last weakening.
CORRECT_Q25 = Weakening("none, q = 0.25", contextlib.nullcontext, WEAKENINGS["sampling 2x, q = 0.25"].overrides)


def audit_run(
    weakening: Weakening,
    canaries: int,
    seed: int,
    rounds: int = ROUNDS,
    support: int | None = None,
    guess_rule: str = "one_sided",
) -> AuditResult:
    """One audited run of the Table IV privacy on the fake grid, with ``weakening`` in place; its final audit
    (``support``: sparse canaries on that many coordinates; ``guess_rule``: the lower bound's guesses)."""
    sparse = () if support is None else (f"audit.support={support}",)
    strategy = build(*TABLE4, f"audit.canaries={canaries}", f"seed={seed}", f"audit.guess_rule={guess_rule}", *sparse,
                     *weakening.overrides)  # fmt: skip
    with weakening.patch():
        strategy.start(ClientPathGrid(), ArrayRecord(zeros(SHAPES)), num_rounds=rounds)
    result = strategy.auditor.result
    assert result is not None
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.audit.power", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10, help="runs per cell (seeds 0..N-1)")
    parser.add_argument("--canaries", type=int, nargs="+", default=[500, 2000])
    parser.add_argument("--support", type=int, default=None, help="sparse canaries on this many coordinates")
    parser.add_argument("--only", nargs="+", default=None, help="weakenings to run, by name prefix (default: all)")
    parser.add_argument("--guess-rule", choices=GUESS_RULES, default="one_sided", help="the lower bound's guesses")
    args = parser.parse_args(argv)
    from flwr.supercore.task_identity import TaskIdentity  # flwr Messages need a task identity outside a ServerApp

    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = 1, 1, 0  # type: ignore[attr-defined]
    logging.getLogger("flwr").setLevel(logging.ERROR)
    kind = "dense canaries" if args.support is None else f"sparse canaries on {args.support} coordinates"
    print(f"d = 20,000, {ROUNDS} rounds, M = 100, q = 0.1, σ = 0.95, δ = 0.01; {kind}; {args.seeds} seeds per row; "
          f"lower bound {args.guess_rule}")  # fmt: skip
    print("| weakening | K | alarms | violations | ε̂ iterates (median) [median low end] | ε̂ final (median) "
          "| lower bound (median; accountant at its δ) | accountant ε | s / run |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    chosen = [
        w
        for w in (*WEAKENINGS.values(), CORRECT_CLIENT_PATH, CORRECT_Q25)
        if args.only is None or w.name.startswith(tuple(args.only))
    ]
    for weakening in chosen:
        for k in args.canaries:
            started = time.perf_counter()
            results = [
                audit_run(weakening, k, seed, support=args.support, guess_rule=args.guess_rule)
                for seed in range(args.seeds)
            ]
            seconds = (time.perf_counter() - started) / args.seeds
            iterates = statistics.median(r.estimate_iterates.epsilon for r in results)
            iterates_low = statistics.median(r.estimate_iterates.low for r in results)
            final = statistics.median(r.estimate_final.epsilon for r in results)
            bound = statistics.median(r.lower_bound.epsilon for r in results)
            print(
                f"| {weakening.name} | {k} | {sum(r.alarm for r in results)}/{len(results)} "
                f"| {sum(r.violation for r in results)}/{len(results)} | {iterates:.3g} [{iterates_low:.3g}] "
                f"| {final:.3g} | {bound:.3g} ({results[0].accountant_epsilon_at_bound_delta:.3g}) "
                f"| {results[0].accountant_epsilon:.3g} | {seconds:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
