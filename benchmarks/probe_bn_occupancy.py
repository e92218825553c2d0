"""Probe for the pytest worker crash (a segfault inside libcuda, forty-fourth session: in
cuOccupancyMaxActiveClusters, deterministic in the replay of the forty-third session's
crashing worker, test_gpu_staged_cl_kernels_rebuilt[64x14x14x1024]'s second round, after
drop_modules emptied the occupancy cache and the query ran again for a kernel already launched
as a cooperative grid).

    python benchmarks/probe_bn_occupancy.py {requery,query_only,rebuilt,memo} COUNT

requery: one forward + backward (the staged channels-last kernels' cooperative launches), then
COUNT rounds of the uncached occupancy query of the backward kernel, each followed by another
backward; query_only: COUNT queries, no launch before them; rebuilt: COUNT rounds of the test's
body (forward, backward, drop_modules, gc); memo: whether CuPy hands a second RawModule of the
same source and options the module it loaded for the first (its memo), or loads another copy.
A crash shows as exit status -11."""
from __future__ import annotations

import faulthandler
import gc
import sys

import cupy
import numpy

import cunorm
from cunorm import _compile, _launch
from cunorm._checks import BFLOAT16
from cunorm.ops import _batch_norm


def main(mode: str, count: int) -> None:
    faulthandler.enable()
    shape, c = (64, 14, 14, 1024), 1024
    rng = numpy.random.default_rng(0)
    x = cupy.asarray((rng.standard_normal(shape) * 2 + 30).astype(BFLOAT16))
    dy, res = (cupy.asarray(rng.standard_normal(shape).astype(BFLOAT16)) for _ in range(2))
    w, b = (cupy.asarray(rng.standard_normal(c).astype(numpy.float32)) for _ in range(2))

    def both():
        y, mean, rstd = cunorm.batch_norm(x, w, b, channel_axis=-1, residual=res, activation="relu",
                                          return_stats=True)
        cunorm.batch_norm_backward(dy, x, w, b, mean, rstd, channel_axis=-1, residual=res, activation="relu")

    lay = _batch_norm.layout(shape, tuple(s // 2 for s in x.strides), 3)
    p = _batch_norm.plan(lay, numpy.dtype(BFLOAT16), numpy.dtype(numpy.float32), 0, 0)
    st = p.staged_cl_bwd
    device = cupy.cuda.Device().id
    fn = _batch_norm._staged_cl_kernel(p, 1, "", device, True)
    query = _launch.max_active_clusters.__wrapped__
    print(f"{mode}: bwd stage {st}, fn {fn:#x}", flush=True)
    if mode == "memo":
        name = f"bn_bwd_staged_cl<{st.threads}, __nv_bfloat16, float, 1, true>"
        code = _compile.kernel_source(_batch_norm.KERNEL_FILE)
        options = (*_compile.COMPILE_OPTIONS, *_compile.device_options(device))
        first, second = (cupy.RawModule(code=code, options=options, name_expressions=(name,)) for _ in range(2))
        a, b = first.get_function(name).kernel, second.get_function(name).kernel
        print(f"   memo: same module object {first.module is second.module}, function pointers {a.ptr:#x} "
              f"{b.ptr:#x}, cunorm's {fn:#x}", flush=True)
    elif mode == "query_only":
        for i in range(count):
            query(fn, st.threads, st.smem, st.cluster, True)
    elif mode == "requery":
        both()
        for i in range(count):
            got = query(fn, st.threads, st.smem, st.cluster, True)
            if i == 0:
                print(f"   query after a launch: {got}", flush=True)
            both()
    elif mode == "rebuilt":
        for i in range(count):
            both()
            _compile.drop_modules()
            gc.collect()
            fn2 = _batch_norm._staged_cl_kernel(_batch_norm.plan(lay, numpy.dtype(BFLOAT16),
                                                                 numpy.dtype(numpy.float32), 0, 0), 1, "", device, True)
            if fn2 != fn:
                print(f"   round {i}: the kernel's pointer moved {fn:#x} -> {fn2:#x}", flush=True)
                fn = fn2
    cupy.cuda.Device().synchronize()
    print(f"{mode}: {count} rounds, no crash")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
