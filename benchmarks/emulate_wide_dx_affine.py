"""v108's accuracy check, on the CPU (no GPU): LayerNorm's backward dx of one bf16 row in
float32 as the wide clusters' write_dx computes it — through xhat (main) and as v108's
fma(w dy, rstd, fma(x, a, b)) — against the float64 reference of the same rounded inputs.
The row's statistics follow the forward (mean = first element + the mean of x - it) and
the sums the kernel's (float32; numpy's pairwise order, not the kernel's). fma(a, b, c) is
a float64 product and sum rounded once to float32. Rows of 65536: plain, +1000, +1e4 with
sd 30, 1000s with one element off, constant 3 and 1000, bimodal +50.

    python benchmarks/emulate_wide_dx_affine.py   (results/emulate-wide-dx-affine.txt)
"""
import ml_dtypes
import numpy

bf16 = ml_dtypes.bfloat16
f32 = numpy.float32
def fma(a, b, c):
    return (a.astype(numpy.float64) * b + c).astype(f32)
def run(x, dy, w, label):
    x = x.astype(bf16); dy = dy.astype(bf16); w = w.astype(bf16)
    xf, gf, wf = x.astype(f32), dy.astype(f32), w.astype(f32)
    n = x.size
    pivot = xf[0]
    mu = f32(numpy.sum(xf - pivot, dtype=f32) / f32(n))
    mean = f32(pivot + mu)
    var = f32(numpy.sum((xf - mean) ** 2, dtype=f32) / f32(n))
    rstd = f32(1 / numpy.sqrt(numpy.float64(var) + 1e-5))
    wdy = (wf * gf).astype(f32)
    c1 = numpy.sum(wdy, dtype=f32)
    c2 = f32(numpy.sum(wdy * (xf - mean), dtype=f32) * rstd)
    m1, m2 = f32(c1 / f32(n)), f32(c2 / f32(n))
    xhat = ((xf - mean) * rstd).astype(f32)
    dx_old = (rstd * (wdy - m1 - xhat * m2)).astype(f32)
    a = f32(-(rstd * rstd) * m2); b = f32(-(mean * a) - rstd * m1)
    dx_new = fma(wdy, rstd, fma(xf, a, b))
    # float64 reference from the bf16 inputs
    X, G, W = (v.astype(numpy.float64) for v in (x, dy, w))
    M = X.mean(); R = 1 / numpy.sqrt(X.var() + 1e-5); XH = (X - M) * R; WG = W * G
    ref = R * (WG - WG.mean() - XH * (WG * XH).mean())
    scale = numpy.abs(ref).max()
    for name, d in (("old", dx_old), ("new", dx_new)):
        err = numpy.abs(d.astype(numpy.float64) - ref)
        # also after rounding to bf16 (what the kernel stores)
        errb = numpy.abs(d.astype(bf16).astype(numpy.float64) - ref)
        print(f"{label:28s} {name}: max err f32 {err.max():.3e} (rel to max|dx| {err.max()/scale:.2e}), "
              f"bf16-stored max rel-elementwise {numpy.max(errb / (numpy.abs(ref) + 1e-2 * scale)):.2e}")
rng = numpy.random.default_rng(0)
N = 65536
g = rng.standard_normal(N); w = 1 + 0.1 * rng.standard_normal(N)
run(rng.standard_normal(N), g, w, "normal")
run(1000 + rng.standard_normal(N), g, w, "offset 1000")
run(1e4 + 30 * rng.standard_normal(N), g, w, "offset 1e4 sd 30")
x = numpy.full(N, 1000.0); x[5] = 1004.0
run(x, g, w, "1000s, one ulp off")
x = numpy.full(N, 3.0)
run(x, g, w, "constant 3")
x = numpy.full(N, 1000.0)
run(x, g, w, "constant 1000")
x = rng.standard_normal(N); x[::2] += 50
run(x, g, w, "bimodal +50")
