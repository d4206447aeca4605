"""List endpoints at scale: an admin `GET /v1/ports` (every tenant's ports, one page of up to 10,000) as the
ports grow, on PostgreSQL (or SQLite) with the controller as its own process.

    python bench/api_lists.py [--sizes 1000,3000,7000] [--backend postgres|sqlite] [--reps 5]

Prints the median time per list and per 1,000 rows at each size, and the ratio of the per-1,000-rows time to the
smallest size's, measured in the same run: ~1.0 means lists grow linearly (the issue's figure was 7.4 s for
6,940 ports when each port's groups were one query; the target is under 100 ms per 1,000 rows).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.control_plane import ControllerProcess
from tests.support.controller import PgDatabase

TENANTS = 10


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,3000,7000")
    ap.add_argument("--backend", default="postgres", choices=["postgres", "sqlite"])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    pg = PgDatabase() if args.backend == "postgres" else None
    ctl = ControllerProcess(pg.url if pg else None, workers=1)
    try:
        orch = ctl.orchestrator()
        subnets = []
        for t in range(TENANTS):
            c = ctl.tenant(f"t{t}")
            vpc = c.post("/v1/vpcs", {"name": "v", "cidr": "10.0.0.0/16"})
            c.post("/v1/security-groups", {"vpc_id": vpc["id"], "name": "web"})
            subnets.append(c.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.0.0.0/18"})["id"])
        made, rows = 0, []
        for size in sizes:
            while made < size:
                n = min(1000, size - made)
                orch.post("/v1/ports/bulk", {"ports": [{"subnet_id": subnets[(made + i) % TENANTS],
                                                        "name": f"p{made + i}"} for i in range(n)]})
                made += n
            times = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                got = ctl.admin.get("/v1/ports", limit=10_000)
                times.append(time.perf_counter() - t0)
                assert len(got) == size, (len(got), size)
            med = statistics.median(times) * 1000
            rows.append((size, med, med / size * 1000))
        base = rows[0][2]
        print(f"admin GET /v1/ports on {args.backend} ({TENANTS} tenants, each port in its VPC's default group; "
              f"median of {args.reps}):")
        for size, med, per in rows:
            print(f"  {size:6d} ports: {med:7.1f} ms, {per:5.1f} ms per 1,000 rows (x{per / base:.2f} the "
                  f"{rows[0][0]}-port list's; target < 100 ms per 1,000)")
    finally:
        ctl.stop()
        if pg:
            pg.drop()


if __name__ == "__main__":
    main()
