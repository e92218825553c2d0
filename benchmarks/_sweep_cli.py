"""What the benchmark sweeps share: the row-norm cases they walk, and the command line (run,
print as it goes, optionally save JSON)."""
from __future__ import annotations

import argparse
import itertools
import json


def row_norm_cases(row_lengths):
    """(op, dtype, N) for both row norms, bf16 and fp32, at each row length, in that order."""
    import numpy

    from cunorm._checks import BFLOAT16

    return itertools.product(("layer_norm", "rms_norm"), (BFLOAT16, numpy.dtype(numpy.float32)), row_lengths)


def main(sweep, doc: str) -> None:
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    rows = sweep()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
