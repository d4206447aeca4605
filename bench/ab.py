"""A bench run against two checkouts, interleaved: before, after, before, after... on the same machine in the same
hour, and the medians of each figure side by side. Every bench here ends its output with one JSON line of its
figures; this reads that line.

    git worktree add /tmp/before COMMIT && make -C /tmp/before/nfv_gateways/native
    python bench/ab.py --before /tmp/before --runs 5 -- bench/gateway.py --paths xdp,packet --seconds 2

The bench script itself is this checkout's, run in each tree (copied there: a bench that learnt to print its JSON
after the commit measured still measures it); each run's imports come from its tree (PYTHONPATH), the gateway
processes it starts included.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def flat(d: object, prefix: str = "") -> dict[str, float]:
    """The numbers of a JSON document by path (lists of runs left out: their medians are the bench's own)."""
    if isinstance(d, dict):
        return {k: v for key, val in d.items() if key != "runs" for k, v in flat(val, f"{prefix}{key} / ").items()}
    if isinstance(d, int | float) and not isinstance(d, bool) and math.isfinite(d):
        return {prefix.removesuffix(" / "): float(d)}
    return {}


def run(tree: Path, script: str, args: list[str]) -> dict[str, float]:
    target = tree / script
    if tree != HERE:
        shutil.copy(HERE / script, target)
    env = os.environ | {"PYTHONPATH": str(tree)}
    r = subprocess.run([sys.executable, str(target), *args], capture_output=True, text=True, env=env, cwd=tree)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode or not lines:
        raise SystemExit(f"{target} failed ({r.returncode}): {(r.stderr or r.stdout)[-1500:]}")
    return flat(json.loads(lines[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True, help="the other checkout (native code built)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("script", help="bench/NAME.py")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    got: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for i in range(a.runs):
        for side, tree in (("before", a.before.resolve()), ("after", HERE)):
            got[side].append(run(tree, a.script, args))
            # each run's figures as they come: a run cut short still leaves the ones before it
            print(f"run {i + 1}/{a.runs} {side}: {json.dumps(got[side][-1])}", file=sys.stderr, flush=True)
    keys = [k for k in got["after"][0] if all(k in r for side in got.values() for r in side)]
    med = {side: {k: statistics.median(r[k] for r in rows) for k in keys} for side, rows in got.items()}
    print(f"\n{a.script} {' '.join(args)}: medians of {a.runs} interleaved runs\n")
    print("| figure | before | after | after / before |\n|---|---|---|---|")
    for k in keys:
        b, x = med["before"][k], med["after"][k]
        print(f"| {k} | {b:,.2f} | {x:,.2f} | {x / b:.2f} |" if b else f"| {k} | {b} | {x} | - |")
    print(json.dumps({"medians": med, "runs": got}))


if __name__ == "__main__":
    main()
