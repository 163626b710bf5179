# sigma as pfl's PLDPrivacyAccountant would compute it for benchmarks' banded_matrix_factorization (argument_parsing.py:416-425),
# and the epsilon that the same sigma gives under other readings.  Uses dp_accounting PLD like pfl (privacy_accountant.py:220-246).
import numpy as np
from scipy.optimize import brentq
from scipy.stats import norm
from dp_accounting.pld import privacy_loss_distribution as P
def eps(sigma,q,k,delta,vdi=1e-3):
    pld=P.from_gaussian_mechanism(standard_deviation=sigma,sensitivity=1,sampling_prob=q,pessimistic_estimate=True,
                                  use_connect_dots=True,value_discretization_interval=vdi)
    return pld.self_compose(k).get_epsilon_for_delta(delta)
def eps_gauss(mu,delta):  # exact eps for a Gaussian mechanism with mu = sens/sigma (k-fold composition: mu=sqrt(k)/sigma)
    f=lambda e: norm.cdf(-e/mu+mu/2)-np.exp(e+norm.logcdf(-e/mu-mu/2))-delta
    return brentq(f,0,mu*mu/2+20*mu+10) if f(0)>0 else 0.0
for name,n,b,C,Pop,e0,d in [("lm/SO",2000,48,5000,1e6,2.0,1e-6),("llm/aya",1000,48,5000,1e6,2.0,1e-6),("cifar10",1500,48,1000,1e6,2.0,1e-6)]:
    k=-(-n//b); q=C/Pop
    s=brentq(lambda s: eps(s,q,k,d)-e0, 0.05, 50, xtol=1e-3)
    s_noamp=brentq(lambda s: eps_gauss(np.sqrt(k)/s,d)-e0, 0.05, 500)
    print(f"{name}: k={k} q={q}  pfl sigma={s:.3f} (eps {e0}); sigma needed w/o amplification (k Gaussians, sens 1 each)={s_noamp:.3f}")
    print(f"   same sigma: eps if b-min-sep held but no subsampling amplification = {eps_gauss(np.sqrt(k)/s,d):.2f};"
          f" eps under cyclic-Poisson reading q'=b*C/P={min(1,b*q)} = {eps(s,min(1,b*q),k,d):.2f}")
