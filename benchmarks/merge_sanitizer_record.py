"""A GPU check's record with a sanitizer tool's entry taken from a second call on the same
sources: where a tool ran past its timeout beside the tests (racecheck on an H100 in the
forty-seventh session), a second device call runs it alone

    python3 -m cunorm.gpucheck --out $OUT/r --no-tests --no-bench --sanitizer racecheck --sanitizer-timeout 570

and this writes the first record with that tool's entry replaced (with the second call's date
and a note saying so); records of other sources are refused.

    python benchmarks/merge_sanitizer_record.py FIRST.json SECOND.json OUT.json [--note TEXT]
"""
from __future__ import annotations

import argparse
import json


def merged(first: dict, second: dict, note: str) -> dict:
    if first.get("source_digest") != second.get("source_digest"):
        raise SystemExit(f"records of other sources: {str(first.get('source_digest'))[:12]} and "
                         f"{str(second.get('source_digest'))[:12]}")
    if not second.get("sanitizer"):
        raise SystemExit("the second record ran no sanitizer")
    taken = {e["tool"]: {**e, "date": second["date"], "note": note} for e in second["sanitizer"]}
    out = dict(first)
    out["sanitizer"] = [taken.pop(e["tool"], e) for e in first.get("sanitizer") or []] + list(taken.values())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("first")
    ap.add_argument("second")
    ap.add_argument("out")
    ap.add_argument("--note", default="run alone in a second device call on the same sources")
    args = ap.parse_args()
    with open(args.first) as f, open(args.second) as g:
        record = merged(json.load(f), json.load(g), args.note)
    with open(args.out, "w") as f:
        f.write(json.dumps(record, indent=1) + "\n")
    for e in record["sanitizer"]:
        print(f"{e['tool']}: {'ran, ' + str(e.get('errors')) + ' errors' if e.get('ran') else 'not run'}"
              + (f" ({e['note']})" if e.get("note") else ""))


if __name__ == "__main__":
    main()
