"""The command line the benchmark sweeps share: run, print as it goes, optionally save JSON."""
from __future__ import annotations

import argparse
import json


def main(sweep, doc: str) -> None:
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    rows = sweep()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
