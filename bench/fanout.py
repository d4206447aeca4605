"""The control plane's fan-out: N simulated hypervisors, each running the agent's own southbound client
(`Southbound.watch` on the delta watch, applied with `apply_delta`, as vswitch_agent does; beats every 2 s), against
the controller as deployed (its own process). The watchers and their beats live in a process of their own (their
JSON parsing must not share the GIL with the load), the tenant's creates in this one.

    python bench/fanout.py [--hosts 1000] [--vpcs 1000] [--ports-per-vpc 20] [--rates 5,20,100] [--seconds 10]
                           [--backends postgres,sqlite] [--workers 2]

Workload: `--vpcs` VPCs of `--ports-per-vpc` ports, each VPC's ports on as many hosts (spread so that every host
holds ports of about the same number of VPCs). Then, per rate, single port creates bound to one of the VPC's hosts
for `--seconds`, each timed from the create's answer until the last affected host (every host with a port in that
VPC) holds it; the bytes the watchers received per create; and topology events: a host joining (bytes every other
host received), a host silent until marked down and back (the same). Controller CPU (of one core) and RSS.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import resource
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.control_plane import ControllerProcess
from tests.support.controller import PgDatabase
from tianji.southbound import HostConfig, HostConfigDelta, apply_delta
from tianji.southbound_client import Southbound
from tianjictl.client import Client

BEAT_S = 2.0


class SimHost:
    """One hypervisor's control loops, without a switch: register, watch (the agent's client), beat."""

    def __init__(self, url: str, token: str, name: str, vtep: str) -> None:
        self.api = Southbound(url, token, timeout=30)
        self.name, self.vtep = name, vtep
        self.cfg: HostConfig | None = None
        self.after = -1
        self.seen: dict[str, float] = {}  # port id -> when it first arrived (after the first config)
        self.bytes = 0
        self.silent = threading.Event()  # set: stop beating (a host going silent)

    def take(self, d: HostConfigDelta, answer) -> None:
        t = time.monotonic()
        self.bytes += len(answer.body)
        cfg = apply_delta(self.cfg if self.after >= 0 else None, d)
        if cfg is None:
            self.after = -1
            return
        first = self.cfg is None
        self.cfg, self.after = cfg, cfg.revision
        if not first:
            for e in d.endpoints:
                self.seen.setdefault(e.port_id, t)
            for p in d.ports:
                self.seen.setdefault(p.id, t)

    def watch(self) -> None:
        self.api.register(self.name, self.vtep, "hypervisor")
        self.api.watch(f"/v1/hosts/{self.name}/config/delta", HostConfigDelta,
                       lambda: {"after": self.after, "form": "objects"}, self.take, lambda e: None)


def beats(hosts: list[SimHost], stop: threading.Event) -> None:
    """Every host beats every BEAT_S, spread over the interval, each on its own client (its own connection)."""
    while not stop.is_set():
        t0 = time.monotonic()
        for i, h in enumerate(hosts):
            if not h.silent.is_set():
                try:
                    h.api.beat(h.name, {"ports": {}})
                except Exception:
                    pass
            lag = t0 + BEAT_S * (i + 1) / len(hosts) - time.monotonic()
            if lag > 0:
                time.sleep(lag)


def watchers_main(url: str, tokens: dict[str, str], conn) -> None:
    """The simulated hosts' process: answers the parent's questions on `conn`."""
    raise_fd_limit()
    hosts = [SimHost(url, tok, name, f"172.16.{i // 250}.{i % 250 + 1}") for i, (name, tok) in
             enumerate(tokens.items())]
    for h in hosts:
        threading.Thread(target=h.watch, daemon=True).start()
    stop = threading.Event()
    for k in range(8):  # eight beat threads, a slice of the hosts each
        threading.Thread(target=beats, args=(hosts[k::8], stop), daemon=True).start()
    by_name = {h.name: h for h in hosts}
    while True:
        cmd, arg = conn.recv()
        if cmd == "ready":  # how many hold a config
            conn.send(sum(h.cfg is not None for h in hosts))
        elif cmd == "seen":
            conn.send({h.name: dict(h.seen) for h in hosts})
        elif cmd == "bytes":
            conn.send({h.name: h.bytes for h in hosts})
        elif cmd == "silent":
            name, on = arg
            (by_name[name].silent.set if on else by_name[name].silent.clear)()
            conn.send(True)
        elif cmd == "stop":
            stop.set()
            conn.send(True)
            return


def raise_fd_limit() -> None:
    """Two connections per simulated host, and the controller's side of each: the soft limit up to the hard one."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def cpu_and_rss(pid: int) -> tuple[float, int]:
    """(user+system CPU seconds, RSS MB) of `pid` and its children (uvicorn's workers)."""
    pids = [pid] + [int(x) for x in os.popen(f"pgrep -P {pid}").read().split()]
    cpu, rss = 0.0, 0
    for p in pids:
        try:
            f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            cpu += (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
            rss += int(open(f"/proc/{p}/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // (1 << 20)
        except OSError:
            pass
    return cpu, rss


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))] * 1000, 1) if xs else float("nan")


class Run:
    def __init__(self, backend: str, args: argparse.Namespace) -> None:
        self.args = args
        self.pg = PgDatabase() if backend == "postgres" else None
        raise_fd_limit()  # the controller inherits it
        self.ctl = ControllerProcess(self.pg.url if self.pg else None, args.workers if self.pg else 1)
        self.hosts = [f"sim{i:04d}" for i in range(args.hosts)]
        self.layout: dict[str, list[str]] = {}  # VPC id -> the hosts of its ports
        self.res: dict = {"backend": backend, "hosts": args.hosts}

    def log(self, msg: str) -> None:
        print(f"[{self.res['backend']} {self.args.hosts}] {msg}", flush=True)

    def ask(self, cmd: str, arg=None):
        self.conn.send((cmd, arg))
        return self.conn.recv()

    def load(self) -> None:
        a, n = self.args, len(self.hosts)
        tokens = {h: self.ctl.admin.post("/v1/host-tokens", {"host": h})["token"] for h in self.hosts}
        self.conn, child = mp.Pipe()
        self.proc = mp.Process(target=watchers_main, args=(self.ctl.url, tokens, child), daemon=True)
        self.proc.start()
        t0 = time.monotonic()
        while self.ask("ready") < n:
            if time.monotonic() - t0 > 300:
                raise SystemExit(f"only {self.ask('ready')} of {n} simulated hosts hold a config after 300 s")
            time.sleep(0.5)
        self.log(f"{n} hosts registered and watching in {time.monotonic() - t0:.1f} s")
        t = self.ctl.admin.post("/v1/tenants", {"name": "fanout"})
        self.ctl.admin.put(f"/v1/tenants/{t['id']}/quotas", {"vpcs": -1, "subnets": -1, "ports": -1})
        tenant = Client(self.ctl.url, t["token"])
        orch = self.ctl.orchestrator()
        self.subnets: dict[str, str] = {}
        t0 = time.monotonic()
        for v in range(a.vpcs):
            vpc = tenant.post("/v1/vpcs", {"name": f"v{v}", "cidr": "10.0.0.0/16"})
            sn = tenant.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.0.0.0/20"})
            hosts = [self.hosts[(v * a.ports_per_vpc + j) % n] for j in range(a.ports_per_vpc)]
            orch.post("/v1/ports/bulk", {"ports": [{"subnet_id": sn["id"], "name": f"p{j}", "host": h}
                                                   for j, h in enumerate(hosts)]})
            self.layout[vpc["id"]], self.subnets[vpc["id"]] = sorted(set(hosts)), sn["id"]
            if v % 100 == 99:
                self.log(f"  {v + 1} of {a.vpcs} VPCs loaded ({(v + 1) * a.ports_per_vpc} ports)")
        self.res["load_s"] = round(time.monotonic() - t0, 1)
        time.sleep(3)

    def paced(self, rate: float) -> dict:
        """Creates at `rate` a second for --seconds, each timed to the last affected host."""
        orch = self.ctl.orchestrator()
        made: list[tuple[str, list[str], float, float]] = []  # port, affected hosts, answered, API s
        bytes0 = self.ask("bytes")
        cpu0, _ = cpu_and_rss(self.ctl.proc.pid)
        t_start = time.monotonic()
        vpcs = list(self.layout)
        i = 0
        while (t := time.monotonic()) - t_start < self.args.seconds:
            vid = random.choice(vpcs)
            host = random.choice(self.layout[vid])
            p = orch.post("/v1/ports", {"subnet_id": self.subnets[vid], "name": f"r{rate}-{i}", "host": host})
            done = time.monotonic()
            made.append((p["id"], self.layout[vid], done, done - t))
            i += 1
            time.sleep(max(0.0, t_start + i / rate - time.monotonic()))
        elapsed = time.monotonic() - t_start
        time.sleep(5)  # what is still on its way
        cpu1, rss = cpu_and_rss(self.ctl.proc.pid)
        seen, bytes1 = self.ask("seen"), self.ask("bytes")
        lat, missing = [], 0
        for pid, hosts, answered, _api in made:
            ts = [seen[h].get(pid) for h in hosts]
            if any(x is None for x in ts):
                missing += 1
            else:
                lat.append(max(ts) - answered)
        api = [x[3] for x in made]
        received = sum(bytes1.values()) - sum(bytes0.values())
        return {"rate": rate, "creates": len(made), "achieved_per_s": round(len(made) / elapsed, 1),
                "api_p50_ms": pct(api, 0.5), "api_p99_ms": pct(api, 0.99),
                "last_host_p50_ms": pct(lat, 0.5), "last_host_p99_ms": pct(lat, 0.99),
                "last_host_max_ms": pct(lat, 1.0), "not_delivered": missing,
                "bytes_per_create": round(received / max(1, len(made))),
                "controller_cpu_pct": round(100 * (cpu1 - cpu0) / (elapsed + 5), 1), "controller_rss_mb": rss}

    def topology(self) -> dict:
        out = {}
        b0 = self.ask("bytes")
        self.ctl.admin.post("/v1/hosts", {"name": "joiner", "vtep_ip": "172.17.0.1"})
        time.sleep(5)
        b1 = self.ask("bytes")
        out["host_join_bytes_per_host"] = round((sum(b1.values()) - sum(b0.values())) / len(self.hosts))
        victim = self.hosts[0]
        self.ask("silent", (victim, True))
        down_after = 15.0
        t0 = time.monotonic()
        while self.ctl.admin.get(f"/v1/hosts/{victim}")["status"] != "down":
            if time.monotonic() - t0 > down_after + 10:
                break
            time.sleep(0.5)
        self.ask("silent", (victim, False))
        time.sleep(5)
        b2 = self.ask("bytes")
        out["host_down_up_bytes_per_host"] = round((sum(b2.values()) - sum(b1.values())) / len(self.hosts))
        cpu0, _ = cpu_and_rss(self.ctl.proc.pid)
        time.sleep(10)
        cpu1, rss = cpu_and_rss(self.ctl.proc.pid)
        out["idle_cpu_pct"], out["idle_rss_mb"] = round(10 * (cpu1 - cpu0), 1), rss
        return out

    def close(self) -> None:
        try:
            self.ask("stop")
        except Exception:
            pass
        self.proc.kill()
        self.ctl.stop()
        if self.pg:
            self.pg.drop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--vpcs", type=int, default=1000)
    ap.add_argument("--ports-per-vpc", type=int, default=20)
    ap.add_argument("--rates", default="5,20,100")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--backends", default="postgres")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    results = []
    for backend in args.backends.split(","):
        r = Run(backend, args)
        try:
            r.load()
            rows = []
            for rate in (float(x) for x in args.rates.split(",")):
                rows.append(r.paced(rate))
                r.log(json.dumps(rows[-1]))
            r.res |= {"paced": rows, **r.topology()}
            results.append(r.res)
        finally:
            r.close()
    print("| backend | hosts | creates/s (achieved) | API p50/p99 ms | last affected host p50/p99/max ms | "
          "not delivered | bytes per create | controller CPU % / RSS MB |")
    print("|---|---|---|---|---|---|---|---|")
    for res in results:
        for x in res["paced"]:
            print(f"| {res['backend']} | {res['hosts']} | {x['rate']:g} ({x['achieved_per_s']}) | {x['api_p50_ms']} / "
                  f"{x['api_p99_ms']} | {x['last_host_p50_ms']} / {x['last_host_p99_ms']} / {x['last_host_max_ms']} | "
                  f"{x['not_delivered']} | {x['bytes_per_create']} | {x['controller_cpu_pct']} / "
                  f"{x['controller_rss_mb']} |")
        print(f"topology ({res['backend']}): a host joining {res['host_join_bytes_per_host']} bytes per other host; a "
              f"host down and up {res['host_down_up_bytes_per_host']}; idle CPU {res['idle_cpu_pct']}% of a core, "
              f"RSS {res['idle_rss_mb']} MB; load {res['load_s']} s")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
