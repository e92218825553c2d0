"""Fiftieth session, a CPU emulation for BatchNorm v53's passes: could bn_stats_cl keep
float sums if each thread summed about its own first value (R <= its k values) and only the
conversion to the channel's pivot and the reduction ran in double? Emulated with NumPy
float32 (sequential sums, k values a thread, T threads strided like the channels-last walk)
against float64, beside float sums about the channel's first element (main before v53).
Result (k, T = 95, 64 and 400, 32): the thread pivots cut the error 10-60x but still left
var 2.5e-4 to 4.3e-3 off where the channel is constant but for its first element ("const +
x0"), past the tests' 1e-4 on rstd: not a mend, so the passes keep double sums.

    python benchmarks/emulate_thread_pivots.py
"""
import numpy as np
rng=np.random.default_rng(0)
def thread_sums(vals, pivot):
    s=np.float32(0); q=np.float32(0)
    for v in vals:
        d=np.float32(v-pivot); s=np.float32(s+d); q=np.float32(q+np.float32(d*d))
    return s,q
def var_local(x, k, T):
    # x: channel values (float32), split across T threads of k values each (strided like cl)
    n=len(x); S=0.0; Q=0.0; P=float(x[0])
    for t in range(T):
        vals=x[t::T][:k]
        pt=vals[0]
        s,q=thread_sums(vals,pt)
        d=float(pt)-P; m=len(vals)
        S+=float(s)+m*d; Q+=float(q)+2*d*float(s)+m*d*d
    sh=S/n; return Q/n-sh*sh
def var_global(x,k,T):
    n=len(x); P=x[0]; S=0.0;Q=0.0
    for t in range(T):
        vals=x[t::T][:k]
        s,q=thread_sums(vals,P); S+=float(s); Q+=float(q)
    sh=S/n; return Q/n-sh*sh
for k,T in ((95,64),(400,32)):
    n=k*T
    for case in ('x0=600','x0=-1e4','1e3+N,x0=0','x0=1e6','const+x0'):
        x=rng.standard_normal(n).astype(np.float32)
        if case=='x0=600': x[0]=600
        if case=='x0=-1e4': x[0]=-1e4
        if case=='1e3+N,x0=0': x+=1e3; x[0]=0
        if case=='x0=1e6': x[0]=1e6
        if case=='const+x0': x[:]=np.float32(0.1); x[0]=50
        ref=np.var(x.astype(np.float64))
        vl=var_local(x,k,T); vg=var_global(x,k,T)
        print(k,T,case,'local rel %.2e'%abs(vl/ref-1),'global rel %.2e'%abs(vg/ref-1))
