"""Bandwidth of cunorm's LayerNorm / RMSNorm at the benchmark shapes (M·N = 64 Mi), next to
a device-to-device copy, with the method of ``cunorm._bench`` (the GPU check runs the same).

    python benchmarks/bench_norms.py [--op layer_norm,rms_norm] [--dtype bfloat16,float32] [--n 1024,4096]

(with cunorm installed, or PYTHONPATH set to the checkout)
"""
from __future__ import annotations

import argparse
import json

import numpy

from cunorm import _bench
from cunorm._checks import BFLOAT16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", default="layer_norm,rms_norm")
    ap.add_argument("--dtype", default="bfloat16,float32")
    ap.add_argument("--n", default=",".join(map(str, _bench.ROW_LENGTHS)))
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    dtypes = [BFLOAT16 if d == "bfloat16" else numpy.dtype(d) for d in args.dtype.split(",")]
    copy = _bench.copy_gbps()
    print(f"device-to-device copy: {copy:.1f} GB/s")
    rows = _bench.run(ops=args.op.split(","), dtypes=dtypes, row_lengths=[int(n) for n in args.n.split(",")])
    print(f"\n{'op':10s} {'dtype':8s} {'N':>7s} {'fwd ms':>8s} {'fwd':>6s} {'bwd ms':>8s} {'bwd':>6s}  (fraction of copy)")
    for r in rows:
        print(f"{r['op']:10s} {r['dtype']:8s} {r['N']:7d} {r['fwd_ms']:8.4f} {r['fwd_GBps'] / copy:6.2f} "
              f"{r['bwd_ms']:8.4f} {r['bwd_GBps'] / copy:6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_GBps": copy, "bench": rows}, f, indent=1)


if __name__ == "__main__":
    main()
