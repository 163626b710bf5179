"""Statistics of a canary privacy audit of client-level DP federated learning (pure functions, numpy/scipy).

Setting. K canary clients each own a fixed random unit direction u_i ∈ R^d (:func:`canary_direction`). Each canary
is inserted into training independently with probability 1/2; the others are never inserted and serve as the
null. An inserted canary's update points along +u_i, so it moves the global model along +u_i. For every round t
the server records ⟨u_i, Δ_t⟩ with the model delta Δ_t = w_{t+1} − w_t (:func:`canary_dots`). From those numbers:

**One-run ε estimate** — G. Andrew, P. Kairouz, S. Oh, A. Oprea, H. B. McMahan, V. M. Suriyakumar, "One-shot
Empirical Privacy Estimation for Federated Learning", ICLR 2024 (arXiv 2302.03098v5).

- Test statistic when only the final model is released (§4): the cosine of each canary with the final model
  minus the initial one, cos(u_i, w_T − w_0) (:func:`final_model_statistics`).
- Test statistic when every iterate is released (§4, the all-iterates threat model): the *maximum over rounds* of
  the per-round cosine, max_t cos(u_i, Δ_t) (:func:`all_iterates_statistics`), as in the authors' released code
  (google-research/federated, ``one_shot_epe``: ``max_canary_model_delta_cosines`` for the inserted canaries and
  ``max_unseen_canary_model_delta_cosines`` for the never-inserted ones).
- ε: fit a Gaussian N(mean, std²) to the statistics of the never-inserted canaries and one to those of the
  inserted canaries, and report the ε at δ of that pair of Gaussians (§3 for the Gaussian mechanism, §4 for FL;
  :func:`estimate_epsilon`, :func:`gaussian_pair_epsilon`). The pair's ε is exact for unequal variances: the
  privacy profile δ(ε) = max over both orderings of P_Q[L > ε] − e^ε P_P[L > ε], L = log(dQ/dP) (the
  hockey-stick divergence), inverted for ε by a root finder. For equal variances it is the Gaussian-DP profile of
  Dong, Roth & Su with μ = |Δmean|/std: δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2).
- Uncertainty: a percentile bootstrap that resamples each set with replacement (not in the paper, which reports
  point estimates; added so a run can say how well K canaries pin ε down).

Where this differs from the paper: for the final model the paper uses the *analytic* null N(0, 1/d) (§4: the
cosine of a uniformly random direction with any fixed vector), so that no canary has to be held out; here the null
is always fitted to the never-inserted canaries, which is what the all-iterates statistic needs anyway (the max over
rounds of T null cosines is not N(0, 1/d)) and costs K/2 of the canaries. Under the all-iterates statistic neither
set is Gaussian (a maximum of T nearly Gaussian variables); the Gaussian fit is the paper's approximation and the
resulting ε an *estimate*, not a bound.

**One-run lower bound** — T. Steinke, M. Nasr, M. Jagielski, "Privacy Auditing with One (1) Training Run",
NeurIPS 2023 (arXiv 2305.08846). The audit: m canaries, each included independently with probability 1/2; the
auditor guesses "included" on the k₊ highest scores and "excluded" on the k₋ lowest and abstains on the rest;
with r = k₊ + k₋ guesses of which v are correct, the mechanism is not (ε, δ)-DP at significance p when
P[W ≥ v] ≤ P[Binomial(r, q) ≥ v] + 2mδ · max_{1≤i≤v} P[v − i ≤ Binomial(r, q) < v] / i < p, q = e^ε/(1 + e^ε)
(the approximate-DP theorem; the p-value is computed exactly as in the paper's Appendix D code,
:func:`one_run_p_value`). For δ = 0 this is the pure-DP binomial tail. Trying several guess counts multiplies the
chances of a false certificate, so each of the n counts tried is tested at significance (1 − confidence)/n
(Bonferroni) and the largest certified ε is reported (:func:`one_run_lower_bound`). Even when every guess is
right the bound cannot exceed a ceiling set by m, δ and the confidence alone (:func:`certifiable_epsilon`): an audit
only has teeth where that ceiling is above the accountant's ε, and the ceiling grows with the number of canaries.

Which guesses (:data:`GUESS_RULES`): ``two_sided`` splits each count between the highest scores ("included") and
the lowest ("excluded"), the paper's symmetric rule; ``one_sided`` guesses "included" on the highest scores only
and abstains on the rest (k₋ = 0, which the theorem allows: it holds for any guesses that are a function of the
scores). In a federated run an inserted canary joins each round only with the sampling rate q, so a fraction
(1 − q)^T of the inserted ones never joins and scores like the null under *any* mechanism: the two-sided rule's
"excluded" guesses on the lowest scores are then partly wrong whatever the mechanism does, and its bound stays
below the accountant's ε even for a mechanism with no noise at all; the one-sided rule loses nothing to them.

**Sparse canaries**, to make many canaries affordable (:func:`sparse_canary_direction`): a unit vector supported on
s ≪ d coordinates drawn uniformly without replacement, with Gaussian values. Generating one costs O(s) draws
instead of O(d) and scoring it against r deltas O(s·r) instead of O(d·r) (``canary_dots(..., support=s)``).
Steinke et al.'s bound stays valid with them — the theorem needs only the independent insertion coins and
scores computed without looking at them, whatever the canaries are — but the analytic N(0, 1/d) null of the
final-model cosine is no longer exact (see :func:`sparse_canary_direction`): fit the null to the never-inserted
canaries, as :func:`estimate_epsilon` does by default.

Everything here is pure: the only randomness is the canary stream :func:`canary_direction` (derived from the seed
through :func:`fl_app.privacy.mechanisms.make_rng`) and the bootstrap, which takes an explicit generator.

One idea a module: ``canaries`` (the directions, dense and sparse, and their dot products), ``cosines`` (the test
statistics, Andrew et al. §4), ``gaussian_pair`` (ε of a pair of Gaussians), ``estimate`` (the ε estimate and its
bootstrap), ``lower_bound`` (Steinke et al.), ``checks`` (their argument checks); every name is imported from here.
"""

from fl_app.core.choices import GUESS_RULES
from fl_app.privacy.audit.canaries import (
    AUDIT_STREAM,
    SPARSE_CANARY_KEY,
    canary_direction,
    canary_dots,
    sparse_canary_direction,
    to_dense,
)
from fl_app.privacy.audit.cosines import all_iterates_statistics, final_model_statistics
from fl_app.privacy.audit.estimate import EpsilonEstimate, estimate_epsilon
from fl_app.privacy.audit.gaussian_pair import gaussian_pair_delta, gaussian_pair_epsilon
from fl_app.privacy.audit.lower_bound import (
    LowerBound,
    certifiable_epsilon,
    default_guess_counts,
    one_run_lower_bound,
    one_run_p_value,
)

__all__ = [
    "AUDIT_STREAM",
    "GUESS_RULES",
    "SPARSE_CANARY_KEY",
    "EpsilonEstimate",
    "LowerBound",
    "all_iterates_statistics",
    "canary_direction",
    "canary_dots",
    "certifiable_epsilon",
    "default_guess_counts",
    "estimate_epsilon",
    "final_model_statistics",
    "gaussian_pair_delta",
    "gaussian_pair_epsilon",
    "one_run_lower_bound",
    "one_run_p_value",
    "sparse_canary_direction",
    "to_dense",
]
