"""``python -m cunorm bench``: cunorm's bandwidth on your GPU, next to other implementations.

    python -m cunorm bench [--op ln,rms,bn] [--dtype bf16,fp32] [--n 1024,4096] [--m 16,128]
                           [--compare torch,compile] [--json out.json] [--plot out.png]

Bandwidth is the bytes that must move (forward: x read, y written; backward: x and dy read,
dx written) over the median kernel time, shown as a fraction of a device-to-device copy
measured in the same run. Without ``--m`` each N runs with M = 64 Mi / N rows (inputs far
larger than L2); ``--m`` lists row counts to run at every N instead. BatchNorm (``bn``,
training, NCHW and channels-last) runs issue 5's four CNN shapes; --n and --m do not apply.
"""
from __future__ import annotations

import argparse
import json
import sys

OPS = {"ln": "layer_norm", "rms": "rms_norm", "bn": "batch_norm"}
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _choices(kind: str, table: dict):
    """argparse type: a comma list of names from ``table`` (short or long) -> long names."""
    def parse(text: str) -> list[str]:
        out = []
        for item in filter(None, (t.strip() for t in text.split(","))):
            long = table.get(item, item if item in table.values() else None)
            if long is None:
                raise argparse.ArgumentTypeError(f"unknown {kind} {item!r} (choose from {', '.join(table)})")
            out.append(long)
        if not out:
            raise argparse.ArgumentTypeError(f"no {kind} given")
        return out
    return parse


def _ints(text: str) -> list[int]:
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _peers(text: str) -> list[str]:
    from ._bench_peers import PEERS

    return _choices("system", {p: p for p in PEERS})(text)


def parser() -> argparse.ArgumentParser:
    from ._bench import ROW_LENGTHS

    ap = argparse.ArgumentParser(prog="python -m cunorm bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", type=_choices("op", OPS), default=list(OPS.values()), help="ln, rms, bn (default all)")
    ap.add_argument("--dtype", type=_choices("dtype", DTYPES), default=["bfloat16", "float32"],
                    help="bf16, fp16, fp32 (default bf16,fp32)")
    ap.add_argument("--n", type=_ints, default=list(ROW_LENGTHS), help="row lengths (default 512 ... 1048576)")
    ap.add_argument("--m", type=_ints, default=None, help="row counts (default 64 Mi / N)")
    ap.add_argument("--compare", type=_peers, default=[], help="torch, compile")
    ap.add_argument("--json", metavar="PATH", help="write the rows and the copy bandwidth as JSON")
    ap.add_argument("--plot", metavar="PATH", help="draw GB/s against N per op as a PNG (needs matplotlib)")
    return ap


def _no_gpu_reason() -> str | None:
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed (pip install 'cunorm[cuda13]' or cupy-cuda12x)"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver, or a driver without devices
        return f"no CUDA device ({type(e).__name__}: {e})"
    return None if count else "no CUDA device"


def run(args, log=lambda s: print(s, file=sys.stderr, flush=True)) -> dict:
    import numpy

    from . import _bench
    from ._checks import BFLOAT16

    peers = []
    for name in args.compare:
        from ._bench_peers import unavailable

        reason = unavailable(name)
        if reason:
            log(f"note: skipping {name}: {reason}")
        else:
            peers.append(name)
    copy = _bench.copy_gbps()
    log(f"device-to-device copy: {copy:.1f} GB/s")
    shapes = [(n, m) for n in args.n for m in (args.m or [None])]
    jobs = [(op, dt, n, m) for op in args.op if op != "batch_norm" for dt in args.dtype for n, m in shapes]
    rows = []
    for i, (op, dt, n, m) in enumerate(jobs, 1):
        dtype = BFLOAT16 if dt == "bfloat16" else numpy.dtype(dt)
        row = _bench.bench_row_norm(op, dtype, n, m)
        row["default_m"] = m is None
        line = (f"[{i}/{len(jobs)}] {op} {dt} M={row['M']} N={n}: fwd {row['fwd_GBps']:.0f} "
                f"bwd {row['bwd_GBps']:.0f} GB/s")
        for name in peers:
            from ._bench_peers import time_peer

            t = time_peer(name, op, dt, row["M"], n)
            row[name] = {f"{d}_{k}": v for d in ("fwd", "bwd") for k, v in (
                ("ms", round(t[f"{d}_ms"], 5)),
                ("GBps", round(row[f"{d}_GBps"] * row[f"{d}_ms"] / t[f"{d}_ms"], 1)),  # same bytes, their time
                ("speedup", round(t[f"{d}_ms"] / row[f"{d}_ms"], 3)))}
            line += f"; {name} x{row[name]['fwd_speedup']:.2f} / x{row[name]['bwd_speedup']:.2f}"
        log(line)
        rows.append(row)
    result = {"copy_GBps": round(copy, 1), "peers": peers, "rows": rows}
    if "batch_norm" in args.op:
        from . import _bench_bn

        result["batch_norm"] = _bench_bn.run(copy, args.dtype, peers, log)
    return result


def table(result: dict) -> str:
    """The end-of-run table: times, GB/s, fraction of copy, speed-up over each peer."""
    copy, peers = result["copy_GBps"], result["peers"]
    head = (f"{'op':10s} {'dtype':8s} {'M':>7s} {'N':>7s} {'fwd ms':>8s} {'GB/s':>7s} {'copy':>5s} "
            f"{'bwd ms':>8s} {'GB/s':>7s} {'copy':>5s}")
    for name in peers:
        head += f"  {'vs ' + name + ' f/b':>17s}"
    lines = [f"copy {copy:.1f} GB/s (read + write)", head]
    for r in result["rows"]:
        line = (f"{r['op']:10s} {r['dtype']:8s} {r['M']:7d} {r['N']:7d} {r['fwd_ms']:8.4f} {r['fwd_GBps']:7.0f} "
                f"{r['fwd_GBps'] / copy:5.2f} {r['bwd_ms']:8.4f} {r['bwd_GBps']:7.0f} {r['bwd_GBps'] / copy:5.2f}")
        for name in peers:
            p = r[name]
            line += f"  {'x%.2f / x%.2f' % (p['fwd_speedup'], p['bwd_speedup']):>17s}"
        lines.append(line)
    lines.append("speed-up = the peer's median time / cunorm's (above 1: cunorm is faster)")
    if result.get("batch_norm"):
        from ._bench_bn import table as bn_table

        lines.append(bn_table(result["batch_norm"]))
    return "\n".join(lines)


def bench_main(argv) -> int:
    args = parser().parse_args(argv)
    if args.plot:
        from ._plot import require_matplotlib

        missing = require_matplotlib()
        if missing:
            print(f"cunorm bench: --plot: {missing}", file=sys.stderr)
            return 2
    reason = _no_gpu_reason()
    if reason:
        print(f"cunorm bench: needs a CUDA GPU: {reason}", file=sys.stderr)
        return 1
    result = run(args)
    print(table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.plot:
        from ._plot import plot

        plot(result, args.plot)
        print(f"plot: {args.plot}")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m cunorm bench [options]   (python -m cunorm bench --help)")
        return 0 if argv else 2
    if argv[0] == "bench":
        return bench_main(argv[1:])
    print(f"python -m cunorm: unknown command {argv[0]!r} (commands: bench)", file=sys.stderr)
    return 2
