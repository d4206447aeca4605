"""Control-plane benchmark: API create throughput, per-host compile time, and port-create-to-watch latency.

    python bench/control_plane.py [--tenants 200] [--ports 20000] [--hosts 100] [--backends sqlite,postgres]

200 tenants x 5 VPCs x 4 subnets; ports spread over the hosts; measured at 10% and at 100% of the ports, so the
growth is visible. Watchers long-poll the configs of a sample of hosts the way agents do.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from tempfile import mkdtemp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import subprocess  # noqa: E402

from controller.client import Client  # noqa: E402
from controller.compiler import compile_host  # noqa: E402
from controller.db import Database  # noqa: E402
from tests.conftest import PgDatabase, free_port  # noqa: E402

BIN = Path(sys.executable).parent / "tianji"


class ControllerProcess:
    """The controller as its own process(es), as deployed: the bench's clients must not share its GIL."""

    def __init__(self, database_url: str | None, workers: int) -> None:
        self.state = Path(mkdtemp(prefix="tianji-bench-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [str(BIN), "controller", "serve", "--port", str(self.port), "--state-dir", str(self.state),
               "--workers", str(workers), "--log-level", "warning"]
        if database_url:
            cmd += ["--database-url", database_url]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(self.state / "log", "w"))
        deadline = time.time() + 30
        while True:
            try:
                self.admin_token = (self.state / "admin.token").read_text().strip()
                Client(self.url, self.admin_token).get("/healthz")
                break
            except Exception:  # noqa: BLE001
                if time.time() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("controller did not start: " + (self.state / "log").read_text()) from None
                time.sleep(0.2)
        self.admin = Client(self.url, self.admin_token)
        self.db = Database(database_url or f"sqlite:///{self.state / 'tianji.db'}")

    def tenant(self, name: str) -> Client:
        t = self.admin.post("/v1/tenants", {"name": name})
        return Client(self.url, t["token"])

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(15)
        self.db.engine.dispose()


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))] if xs else float("nan")


class Watcher(threading.Thread):
    """Long-polls one host's config like an agent and records when each port id first appears."""

    def __init__(self, url: str, token: str, host: str) -> None:
        super().__init__(daemon=True)
        self.c = Client(url, token, timeout=60)
        self.host, self.seen, self.stop = host, {}, False

    def run(self) -> None:
        after = -1
        while not self.stop:
            try:
                cfg = self.c.get(f"/v1/hosts/{self.host}/config", after=after, timeout=2)
            except Exception:  # noqa: BLE001 - the controller is going away at the end of a run
                if self.stop:
                    return
                raise
            if cfg:
                now = time.monotonic()
                after = cfg["revision"]
                for p in cfg["ports"]:
                    self.seen.setdefault(p["id"], now)


def run(backend: str, args: argparse.Namespace) -> dict:
    pg = PgDatabase() if backend == "postgres" else None
    ctl = ControllerProcess(pg.url if pg else None, args.workers if pg else 1)
    try:
        adm = ctl.admin
        hosts = [f"hv{i:03d}" for i in range(args.hosts)]
        for i, h in enumerate(hosts):
            adm.post("/v1/hosts", {"name": h, "vtep_ip": f"172.16.{i // 250}.{i % 250 + 1}"})
        print(f"[{backend}] creating {args.tenants} tenants x 5 VPCs x 4 subnets ...", flush=True)

        def make_tenant(i: int) -> list[tuple[Client, str]]:
            t = ctl.tenant(f"tenant{i}")
            out = []
            for v in range(5):
                vpc = t.post("/v1/vpcs", {"name": f"v{v}", "cidr": f"10.{v}.0.0/16"})
                for s in range(4):
                    out.append((t, t.post("/v1/subnets", {"vpc_id": vpc["id"], "name": f"s{s}",
                                                          "cidr": f"10.{v}.{s}.0/24"})["id"]))
            return out

        with ThreadPoolExecutor(8) as ex:
            subnets = [x for xs in ex.map(make_tenant, range(args.tenants)) for x in xs]
        watched = hosts[: args.watchers]
        watchers = [Watcher(ctl.url, ctl.admin_token, h) for h in watched]
        for w in watchers:
            w.start()
        time.sleep(1)
        created: dict[str, tuple[float, str]] = {}
        results = {}
        done = 0
        checkpoints = sorted({max(1, args.ports // 10), args.ports})
        lock = threading.Lock()

        def create(i: int) -> None:
            t, sn = subnets[i % len(subnets)]
            host = hosts[i % len(hosts)]
            t0 = time.monotonic()
            p = t.post("/v1/ports", {"subnet_id": sn, "name": f"p{i}", "host": host})
            with lock:
                created[p["id"]] = (t0, host)

        for cp in checkpoints:
            n = cp - done
            t0 = time.perf_counter()
            with ThreadPoolExecutor(args.clients) as ex:
                list(ex.map(create, range(done, cp)))
            rate = n / (time.perf_counter() - t0)
            done = cp
            time.sleep(1.5)  # let the watches catch up
            lat = [(w.seen[pid] - t0c) * 1000 for w in watchers for pid, (t0c, h) in created.items()
                   if h == w.host and pid in w.seen]
            missing = sum(1 for w in watchers for pid, (_, h) in created.items() if h == w.host and pid not in w.seen)
            comp = []
            for h in hosts:
                with ctl.db.snapshot() as s:
                    c0 = time.perf_counter()
                    compile_host(s, h)
                    comp.append((time.perf_counter() - c0) * 1000)
            results[cp] = {"create_per_s": rate, "visible_p50_ms": pct(lat, 50), "visible_p99_ms": pct(lat, 99),
                           "missing": missing, "compile_p50_ms": pct(comp, 50), "compile_p99_ms": pct(comp, 99)}
            print(f"[{backend}] {cp:>6} ports: {rate:7.0f} creates/s  visible p50 {pct(lat, 50):6.1f} ms "
                  f"p99 {pct(lat, 99):6.1f} ms (missing {missing})  compile p50 {pct(comp, 50):5.1f} ms "
                  f"p99 {pct(comp, 99):5.1f} ms", flush=True)
        for w in watchers:
            w.stop = True
        for w in watchers:
            w.join(5)
        return results
    finally:
        ctl.stop()
        if pg:
            pg.drop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tenants", type=int, default=200)
    ap.add_argument("--ports", type=int, default=20000)
    ap.add_argument("--hosts", type=int, default=100)
    ap.add_argument("--watchers", type=int, default=10)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--workers", type=int, default=2, help="controller worker processes on PostgreSQL")
    args = ap.parse_args()
    os.environ.setdefault("TIANJI_TEST_PG", "1")
    all_results = {b: run(b, args) for b in args.backends.split(",")}
    print("\nbackend   ports  creates/s  visible p50/p99 ms  compile p50/p99 ms  (targets on PostgreSQL at 20k: "
          ">=300/s, <100/<500 ms, p99 <50 ms)")
    for b, res in all_results.items():
        base = res[min(res)]
        for n, r in sorted(res.items()):
            growth = r["compile_p99_ms"] / base["compile_p99_ms"] if base["compile_p99_ms"] else float("nan")
            print(f"{b:9} {n:6} {r['create_per_s']:9.0f}  {r['visible_p50_ms']:7.1f}/{r['visible_p99_ms']:<8.1f}"
                  f"  {r['compile_p50_ms']:6.1f}/{r['compile_p99_ms']:<6.1f}  compile growth x{growth:.2f}")
    print("(OVN 23.03 on this kind of machine, 10,000 ports loaded: median 3.75 s from port add to flows)")


if __name__ == "__main__":
    main()
