import numpy as np
rng=np.random.default_rng(0)
def mc(n,q,b,U=20000):
    X=rng.random((U,n))<q; viol=0
    for u in range(U):
        t=np.flatnonzero(X[u]); viol+= (len(t)>1 and np.diff(t).min()<b)
    return viol/U
print("SO sim", mc(2000,0.00117,48), "(DP 0.1106)"); print("lm model", mc(2000,0.00499,48), "(DP 0.8245)")
