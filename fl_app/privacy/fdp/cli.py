"""The calculator's command line, ``python -m fl_app.privacy.fdp``: μ, ε(δ), δ and the L assumption of
:func:`~fl_app.privacy.fdp.bound.noisy_bound`; defaults are the paper's Sec. 5 setting.
"""

from __future__ import annotations

import argparse
import sys

from fl_app.core.choices import NOISY_SCHEDULES
from fl_app.privacy.fdp.bound import ALGORITHMS, noisy_bound


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fl_app.privacy.fdp",
        description=(
            "Gaussian-DP (f-DP) bound of Noisy-FedAvg (Thm 3) / Noisy-FedProx (Thm 4) of Sun et al., converted to "
            "(epsilon, delta)-DP by Lemma 3. Defaults are the paper's Sec. 5 setting (Fig. 2: m=20, K=5, V=10; "
            "stage-wise decay; T=600 as in Table 5; sigma=0.1 from Table 4), lr=0.01, L=1 (an assumption), "
            "delta=1e-5."
        ),
    )
    parser.add_argument("--algorithm", choices=ALGORITHMS, default="noisy_fedavg", help="default: noisy_fedavg")
    parser.add_argument("--schedule", choices=NOISY_SCHEDULES, default="stagewise", help="default: stagewise")
    parser.add_argument("--V", type=float, default=10.0, help="gradient clipping norm (default 10)")
    parser.add_argument("--K", type=int, default=5, help="local steps per round (default 5)")
    parser.add_argument("--m", type=float, default=20.0, help="clients averaged per round (default 20)")
    parser.add_argument("--sigma", type=float, default=0.1, help="absolute noise std per client (default 0.1)")
    parser.add_argument("--L", type=float, default=1.0, help="assumed smoothness constant (default 1)")
    parser.add_argument("--T", type=int, default=600, help="communication rounds (default 600)")
    parser.add_argument("--lr", type=float, default=0.01, help="learning-rate constant of the schedule (default 0.01)")
    parser.add_argument("--delta", type=float, default=1e-5, help="target delta (default 1e-5)")
    parser.add_argument("--alpha", type=float, default=None, help="proximal coefficient (noisy_fedprox; > L)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Print μ, ε(δ), δ and the L assumption; return 0, or 2 (message on stderr) for invalid parameters."""
    args = _parser().parse_args(argv)
    try:
        bound = noisy_bound(
            args.algorithm,
            args.schedule,
            lr=args.lr,
            V=args.V,
            K=args.K,
            m=args.m,
            sigma=args.sigma,
            L=args.L,
            T=args.T,
            delta=args.delta,
            alpha=args.alpha,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"mu = {bound.mu:.6g}")
    print(f"epsilon = {bound.epsilon:.6g}")
    print(f"delta = {bound.delta:.3g}")
    print(bound.describe())
    return 0
