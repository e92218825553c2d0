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

BF16, F32 = ml_dtypes.bfloat16, numpy.float32


def fma(a, b, c):
    """float32 fused multiply-add: the float64 product (exact) plus c, rounded once."""
    return (a.astype(numpy.float64) * b + c).astype(F32)


def compare(x, dy, w, label: str) -> None:
    """Prints both forms' largest float32 error, and the bf16-rounded outputs' largest
    elementwise error relative to |dx| + 1% of max |dx|."""
    x, dy, w = x.astype(BF16), dy.astype(BF16), w.astype(BF16)
    xf, gf, wf = x.astype(F32), dy.astype(F32), w.astype(F32)
    n = x.size
    pivot = xf[0]
    mean = F32(pivot + F32(numpy.sum(xf - pivot, dtype=F32) / F32(n)))
    var = F32(numpy.sum((xf - mean) ** 2, dtype=F32) / F32(n))
    rstd = F32(1 / numpy.sqrt(numpy.float64(var) + 1e-5))
    wdy = (wf * gf).astype(F32)
    m1 = F32(numpy.sum(wdy, dtype=F32) / F32(n))
    m2 = F32(F32(numpy.sum(wdy * (xf - mean), dtype=F32) * rstd) / F32(n))
    xhat = ((xf - mean) * rstd).astype(F32)
    dx_main = (rstd * (wdy - m1 - xhat * m2)).astype(F32)
    a = F32(-(rstd * rstd) * m2)
    b = F32(-(mean * a) - rstd * m1)
    dx_v108 = fma(wdy, rstd, fma(xf, a, b))
    X, G, W = (v.astype(numpy.float64) for v in (x, dy, w))
    xh = (X - X.mean()) / numpy.sqrt(X.var() + 1e-5)
    wg = W * G
    ref = (wg - wg.mean() - xh * (wg * xh).mean()) / numpy.sqrt(X.var() + 1e-5)
    scale = numpy.abs(ref).max()
    for name, d in (("old", dx_main), ("new", dx_v108)):
        err = numpy.abs(d.astype(numpy.float64) - ref)
        err_bf16 = numpy.abs(d.astype(BF16).astype(numpy.float64) - ref)
        print(f"{label:28s} {name}: max err f32 {err.max():.3e} (rel to max|dx| {err.max() / scale:.2e}), "
              f"bf16-stored max rel-elementwise {numpy.max(err_bf16 / (numpy.abs(ref) + 1e-2 * scale)):.2e}")


def main() -> None:
    rng = numpy.random.default_rng(0)
    n = 65536
    g, w = rng.standard_normal(n), 1 + 0.1 * rng.standard_normal(n)
    compare(rng.standard_normal(n), g, w, "normal")
    compare(1000 + rng.standard_normal(n), g, w, "offset 1000")
    compare(1e4 + 30 * rng.standard_normal(n), g, w, "offset 1e4 sd 30")
    x = numpy.full(n, 1000.0)
    x[5] = 1004.0
    compare(x, g, w, "1000s, one ulp off")
    compare(numpy.full(n, 3.0), g, w, "constant 3")
    compare(numpy.full(n, 1000.0), g, w, "constant 1000")
    x = rng.standard_normal(n)
    x[::2] += 50
    compare(x, g, w, "bimodal +50")


if __name__ == "__main__":
    main()
