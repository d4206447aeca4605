"""How long `tianji` takes to answer, end to end as a user waits for it: `tianji --help` and a tenant's `tianji vpc
list` against a local controller (SQLite, plain HTTP), beside the interpreter starting and doing nothing, in the same
run. Medians of N runs, interleaved.

    python bench/cli.py [--runs 21]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.controller import Controller

TIANJI = str(Path(sys.executable).with_name("tianji"))


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ms = (time.perf_counter() - t0) * 1000
    if r.returncode != 0 or r.stderr.strip():
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr[-400:]}")
    return ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=21)
    a = ap.parse_args()
    home = tempfile.mkdtemp(prefix="tianji-bench-cli-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIANJI_")} | {"HOME": home}
    c = Controller(Path(home) / "state", None)
    try:
        t = c.tenant()
        t.post("/v1/vpcs", {"name": "bench", "cidr": "10.8.0.0/16"})
        token = t.http.headers["Authorization"].split()[1]
        cmds = {"python -c pass": [sys.executable, "-c", "pass"],
                "tianji --help": [TIANJI, "--help"],
                "tianji vpc list": [TIANJI, "--url", c.url, "--token", token, "vpc", "list"]}
        times: dict[str, list[float]] = {k: [] for k in cmds}
        for _ in range(a.runs):
            for k, cmd in cmds.items():
                times[k].append(timed(cmd, env))
    finally:
        c.stop()
    med = {k: round(statistics.median(v), 1) for k, v in times.items()}
    base = med["python -c pass"]
    print(f"\n| command (median of {a.runs}) | ms | less the interpreter's start |\n|---|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v} | {round(v - base, 1)} |")
    print(json.dumps({"median_ms": med}))


if __name__ == "__main__":
    main()
