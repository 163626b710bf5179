# Participation statistics under pfl's benchmark sampler: each iteration draws C users i.i.d. uniformly WITH replacement
# (get_user_sampler('random') -> user_ids[np.random.randint(0, len(user_ids))], one draw per cohort slot).
# Per user per iteration: q = 1-(1-1/P)^C  (independent across iterations).  Poisson(q) sampling (the accountant's model) gives the same per-iteration law.
import numpy as np
from scipy.stats import binom
def minsep_violation(n,q,b):
    # P(two participations i<j with j-i<b); Markov chain on "iterations since last participation" capped at b
    v=np.zeros(b+1); v[b]=1.0   # state b = never / >= b ago
    for _ in range(n):
        nv=np.zeros(b+1)
        nv[1]+=v[b]*q                 # allowed participation
        nv[b]+=v[b]*(1-q)
        for s in range(1,b):          # s<b: participating now violates -> drop mass
            nv[min(s+1,b)]+=v[s]*(1-q)
        v=nv
    return 1-v.sum()
rows=[
 # name, P (population), C (per-iteration cohort), n, b
 ("lm/SO  accountant model (noise_cohort 5000, population 1e6)",1e6,5000,2000,48),
 ("lm/SO  simulation (342477 users, cohort 400)",342477,400,2000,48),
 ("flair  accountant model (5000, population default 1e7)",1e7,5000,5000,48),
 ("flair  simulation (41131 users, cohort 200)",41131,200,5000,48),
 ("cifar10 accountant model (1000, population 1e6 hardcoded)",1e6,1000,1500,48),
 ("cifar10_iid simulation (50000/50=1000 users, cohort 50)",1000,50,1500,48),
 ("llm/aya accountant model (5000, population 1e6)",1e6,5000,1000,48),
]
for name,P,C,n,b in rows:
    k=-(-n//b); q=1-(1-1/P)**C
    pk=binom.sf(k,n,q); pm=minsep_violation(n,q,b)
    dup=C*(C-1)/2/P   # expected same-user duplicate pairs inside one cohort (with-replacement only)
    print(f"{name}: q={q:.3g} k={k} E[N]={n*q:.3g} P(N>k)={pk:.3g} E#users N>k={P*pk:.3g} "
          f"P(gap<b)={pm:.4f} E#users gap<b={P*pm:.4g}  E dup pairs/iter(sim only)={dup:.3g}")
