# numpy port of pfl FTRLMatrixFactorizer + PyTorchFTRLBridge (HEAD c9d1f32), then inspect C = np.linalg.cholesky(X)
import numpy as np, sys, scipy.linalg as sl
def lg(A,X,mask):
    c=sl.cho_factor(X, lower=True); H=sl.cho_solve(c, A.T)
    dX=-H@H.T; np.fill_diagonal(dX,0); return np.trace(H@A), dX*mask
def lbfgs(X,dX,pX,pdX):
    S=X-pX; Y=dX-pdX; rho=1/np.sum(Y*S); a=rho*np.sum(S*dX); g=np.sum(S*Y)/np.sum(Y**2)
    Z=g*(dX-rho*np.sum(S*dX)*Y); be=rho*np.sum(Y*Z); return Z+S*(a-be)
def optimize(A,mask,iters=1000):
    X=np.eye(len(A)); loss,dX=lg(A,X,mask); pX,pdX,pl,Z=X,dX,loss,dX
    for _ in range(iters):
        st=1.0
        for _ in range(30):
            X=pX-st*Z
            try: loss,dX=lg(A,X,mask)
            except Exception: st*=0.25; continue
            if loss<pl: pl=loss; break
        if np.abs(dX).max()<=1e-3: return X
        Z=lbfgs(X,dX,pX,pdX); pX,pdX=X,dX
    return X
n,b=int(sys.argv[1]),int(sys.argv[2])
bw=b-1
i,j=np.indices((n,n)); mask=(np.abs(i-j)<bw).astype(float)
X=optimize(np.tril(np.ones((n,n))),mask)
C=np.linalg.cholesky(X)                       # what pfl uses (ftrl_mechanism.py:208)
row=np.linalg.norm(C,axis=1); col=np.linalg.norm(C,axis=0)
k=-(-n//b)
# max over b-min-sep participation patterns of sum of squared column norms (cols >= b-1 apart have disjoint support)
c2=col**2; best=np.zeros(n+b+1)
for t in range(n-1,-1,-1): best[t]=max(best[t+1], c2[t]+best[t+b])
P=np.eye(n)[::-1]; Crev=P@np.linalg.cholesky(P@X@P).T@P   # Google loops.py:284-285 style, Crev^T Crev = X
print(f"n={n} b={b} k={k} rows[min,max]=[{row.min():.4f},{row.max():.4f}] cols[min,max]=[{col.min():.4f},{col.max():.4f}] col0={col[0]:.4f}")
print(f"true b-min-sep sensitivity of pfl C = {np.sqrt(best[0]):.4f}; pfl assumes sqrt(k)={np.sqrt(k):.4f}; ratio={np.sqrt(best[0]/k):.4f}")
print(f"reverse-Cholesky C: lower-tri={np.allclose(Crev,np.tril(Crev))} colnorm max={np.linalg.norm(Crev,axis=0).max():.4f}")
