"""f-DP / Gaussian-DP bound calculator for Noisy-FedAvg and Noisy-FedProx (seed paper 004).

Paper: Y. Sun, Q. Zhang, L. Shen, D. Tao, "Convergent Differential Privacy Analysis for General Federated
Learning" (Theorems, equations and appendices cited by the paper's own numbers). Implemented,
as docs/mechanisms.md (9) and docs/algorithms.md ("Definitions of the baselines": Noisy-FedAvg / Noisy-FedProx)
state it:

- Theorem 3 (a)–(d), Eqs. (15)–(18): the GDP parameter μ of Noisy-FedAvg after T rounds for the constant,
  cyclically decaying, stage-wise decaying and continuously decaying learning-rate schedules
  (:func:`gdp_mu_noisy_fedavg`);
- Theorem 4, Eq. (19): μ of Noisy-FedProx, α > L, η < 1/(α − L) (:func:`gdp_mu_noisy_fedprox`);
- Lemma 3, Eq. (20): μ-GDP ⇒ (ε, δ(ε))-DP (:func:`gdp_to_delta`) and its inverse ε(δ) (:func:`gdp_to_epsilon`);
- Lemma 4: μ-GDP ⇒ (ζ, ζμ²/2)-RDP (:func:`gdp_to_rdp`);
- Lemma 5: T_G(μ_1) ⊗ … ⊗ T_G(μ_n) = T_G(√Σμ_i²) (:func:`compose_gdp`).

Notation. The paper writes its learning-rate constant as μ (η_{k,t} = μ, μ/(k+1), μ/(t+1), μ/(tK+k+1)), which
clashes with the GDP parameter μ. Here the learning-rate constant is ``lr`` and ``mu`` is always the GDP parameter.
V is the per-step gradient clipping norm, K the local steps per round, m the number of clients averaged per round,
σ the *absolute* std of the Gaussian noise each client adds to its uploaded model (not a noise multiplier), T the
rounds so far, L the smoothness constant of every local objective (Assumption 1). L cannot be measured from a run:
it is an assumption supplied by the user, and :meth:`GDPBound.describe` always prints it as such.

Where the theorem reads "T(w_T; w'_T) ≥ T_G(s)" or "> T_G(s)", the value returned is s: the released model is at
least s-GDP (smaller s is stronger privacy).

Constants c and z (Appendix G.2, "Cyclically / Continuously decaying learning rates"):

- c (Thm 3b): the paper bounds Σ_{k=0}^{K-1} 1/(k+1) between ln(K+1) and 1 + ln K (Eq. (27)) and then
  "approximate[s] this term to c ln(K+1) where c is a scaled constant ... 1 ≤ c < 1.543 for any K ≥ 1".
  We take that definition exactly: c = H_K / ln(K+1), H_K = Σ_{k=1}^K 1/k (c = 1/ln 2 at K = 1,
  c → 1 as K → ∞; the 1.543 is the maximum of the upper bound (1 + ln K)/ln(K+1)).
- z (Thm 3d): the paper bounds Σ_{k=0}^{K-1} 1/(tK+k+1) and "let[s] it be z ln((t+2)/(t+1)) to include the term
  at t = 0 ... z > 1 is a constant for any K > 1". A single constant valid for every round t ≥ 0 must
  be at least sup_t Σ_k 1/(tK+k+1) / ln((t+2)/(t+1)), which is attained at t = 0, so z = H_K / ln 2 (the
  smallest such constant; > 1 for every K ≥ 1). ``tests/privacy/test_fdp.py`` checks the inequality for all t.

Deviations of the printed paper from its own derivation (implemented as printed; see also the report):

- Eqs. (16) and (18) (and Table 2's γ_t for these schedules) carry no learning-rate factor, although Lemma 7
  (Eq. (25)) gives γ_t = (2V/m) Σ_k η_{k,t} and the text says Σ_k η_{k,t} = c·lr·ln(K+1). The printed
  bounds are therefore 1/lr times the derived ones: more conservative (larger μ) whenever lr ≤ 1. Eq. (18) does not
  depend on lr or L at all, and Eq. (17) does not depend on L.
- Table 1 prints the denominators as √(mσ) and √(mασ); Eqs. (15)–(19) have √m·σ and √m·α·σ. The equations, which
  follow from Theorem 1 (√m/σ) and Table 2 (γ_t ∝ 1/m, 1/(mα)), are used.
- Eqs. (15), (16), (19) come from the Cauchy–Schwarz value H_0 = (Σ_t P_t γ_t)² / Σ_t P_t², P_t = Π_{j>t} ρ_j
  (Appendix G.3). Its equality case needs λ_{t+1} ∝ P_t / (ρ_t‖w_t − w̃_t‖ + γ_t), which exceeds 1
  when ρ_t > 1 (always so here: ρ_t = (1+lr·L)^K, (1+K)^{c·lr·L}, α/(α−L)), whereas the interpolation requires
  0 ≤ λ_t ≤ 1 (Eq. (9)). With λ constrained to [0, 1] the minimum of Eq. (13) for expansive ρ is the plain
  composition value Σ_t γ_t² (λ ≡ 1), which grows with T. So these "convergent" values are the paper's formulas,
  not a bound this module can vouch for; a side effect is that they *decrease* as L grows (for T ≥ 2), because a
  larger ρ concentrates the Cauchy–Schwarz weights on the last round. Eqs. (17) and (18) are instead obtained from
  H_0 ≤ Σ_t γ_t² ≤ γ_0²(2 − 1/T), i.e. they are composition bounds and do not have this problem.
- Theorem 4 assumes only lr < 1/(α − L), but Lemma 9 uses 1 − lr·α ≥ 0, i.e. lr ≤ 1/α; only the
  theorem's stated condition is enforced.

Everything here is pure math on Python floats (numpy/scipy only); no global state.

One idea a module: ``theorems`` (Thm 3 and Thm 4), ``constants`` (c and z), ``conversions`` (Lemmas 3–5),
``bound`` (:class:`GDPBound`, :func:`noisy_bound`), ``cli`` (``python -m fl_app.privacy.fdp``), ``checks`` (argument
checks); every name is imported from here.
"""

from fl_app.privacy.fdp.bound import ALGORITHMS, Algorithm, GDPBound, noisy_bound
from fl_app.privacy.fdp.cli import main
from fl_app.privacy.fdp.constants import continuous_constant_z, cyclic_constant_c
from fl_app.privacy.fdp.conversions import compose_gdp, gdp_to_delta, gdp_to_epsilon, gdp_to_rdp
from fl_app.privacy.fdp.theorems import gdp_mu_noisy_fedavg, gdp_mu_noisy_fedprox

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "GDPBound",
    "compose_gdp",
    "continuous_constant_z",
    "cyclic_constant_c",
    "gdp_mu_noisy_fedavg",
    "gdp_mu_noisy_fedprox",
    "gdp_to_delta",
    "gdp_to_epsilon",
    "gdp_to_rdp",
    "main",
    "noisy_bound",
]
