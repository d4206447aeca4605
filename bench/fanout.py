"""The control plane's fan-out: N simulated hypervisors, each running the agent's own southbound client
(`Southbound.stream`, applied with `apply_delta`, as vswitch_agent does: a keep-alive line every 10 s, TCP
probes), against the controller as deployed (its own process). The watchers and their beats live in processes
of their own (`--sim-procs`: their JSON parsing must not share the GIL with the load, nor 1,000 agents one GIL),
the tenant's creates in this one.

    python bench/fanout.py [--hosts 1000] [--vpcs 1000] [--ports-per-vpc 20] [--rates 5,20,100] [--seconds 10]
                           [--backends postgres,sqlite] [--workers 2]

Workload: `--vpcs` VPCs of `--ports-per-vpc` ports, each VPC's ports on as many hosts (spread so that every host
holds ports of about the same number of VPCs). Then, per rate, single port creates bound to one of the VPC's hosts
for `--seconds` (open loop: each due at its moment, up to CREATORS in flight), each timed from the create's
answer until the last affected host (every host with a port in that VPC) holds it; the bytes the watchers
received per create; and topology events: a host joining (bytes every other host received), a host silent until
marked down and back (the same). Controller CPU (of one core) and RSS.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import random
import resource
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.control_plane import ControllerProcess
from tests.support.controller import PgDatabase
from tianji.api_client import Client
from tianji.host_delta import apply_delta
from tianji.southbound import HostConfig, HostConfigDelta
from tianji.southbound_client import REPORT_REFRESH_S, Southbound, next_refresh

BEAT_S = 2.0
START_S = 10.0
IDLE_S = REPORT_REFRESH_S  # the idle window
CREATORS = 16  # creates in flight at most (the paced phases are open loop)


class SimHost:
    """One hypervisor's control loops, without a switch: register, follow the config stream (the agent's client,
    falling back to the long-poll as it does), and report as the agent does (only while the stream is down, or
    every REPORT_REFRESH_S)."""

    def __init__(self, url: str, token: str, name: str, vtep: str, mode: str) -> None:
        self.api = Southbound(url, token, timeout=30)
        self.name, self.vtep, self.mode = name, vtep, mode
        self.cfg: HostConfig | None = None
        self.after = -1
        self.seen: dict[str, float] = {}  # port id -> when it first arrived (after the first config)
        self.vteps_seen: dict[str, float] = {}  # VTEP host -> when it first arrived
        self.bytes = 0
        self.silent = threading.Event()  # set: the agent is gone (no stream, no reports)
        self.refresh_at = 0.0  # when its unchanged report is due again
        self.reported_on = -1  # api.report_wanted when its last report went (bumped since: report again)

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
            for v in d.vtep_updates or d.vteps or ():
                self.vteps_seen.setdefault(v.host, t)

    def watch(self, delay: float) -> None:
        """As an agent starts: registered (again and again, with backoff, while the controller cannot answer),
        then following its config."""
        time.sleep(delay)
        wait = 0.5
        while True:
            try:
                self.api.register(self.name, self.vtep, "hypervisor")
                break
            except Exception:
                time.sleep(random.uniform(wait / 2, wait))
                wait = min(8.0, wait * 2)
        self.follow()

    def follow(self) -> None:
        path, params = f"/v1/hosts/{self.name}/config", lambda: {"after": self.after, "form": "objects"}
        if self.mode == "stream" and self.api.stream(f"{path}/stream", HostConfigDelta, params, self.take,
                                                     lambda e: None, self.silent):
            return
        self.api.watch(f"{path}/delta", HostConfigDelta, params, self.take, lambda e: None, self.silent)

    def go_silent(self) -> None:
        """The agent dies: its connections close (its kernel would go on acknowledging a stream it no longer
        reads, and the controller rightly counts that as a live host: controller/southbound/open_streams.py)."""
        self.silent.set()
        self.api.close()

    def resume(self) -> None:
        self.silent.clear()
        threading.Thread(target=self.follow, daemon=True).start()


def beats(hosts: list[SimHost], stop: threading.Event) -> None:
    """Every host reports as the agent does: every BEAT_S while its stream is down, else when the controller
    wants it (a new stream, a `report` event) and about every REPORT_REFRESH_S (next_refresh); spread over the
    interval, each on its own client (its own connection)."""
    while not stop.is_set():
        t0 = time.monotonic()
        for i, h in enumerate(hosts):
            wanted = h.api.report_wanted
            if not h.silent.is_set() and (not h.api.streaming or wanted != h.reported_on or t0 >= h.refresh_at):
                try:
                    h.api.beat(h.name, {"ports": {}})
                    h.refresh_at, h.reported_on = next_refresh(t0), wanted
                except Exception:
                    pass
            lag = t0 + BEAT_S * (i + 1) / len(hosts) - time.monotonic()
            if lag > 0:
                time.sleep(lag)


def watchers_main(url: str, sims: list[tuple[str, str, str]], mode: str, conn) -> None:
    """One process of simulated hosts (name, token, VTEP each): answers the parent's questions on `conn`."""
    raise_fd_limit()
    # as the controller does (controller/serving.py Collector): a full collection of 250 agents' configs stops the
    # process for most of a second, which the measured delivery times would carry; none runs by itself here
    gc.set_threshold(5_000, 10, 1_000_000)
    hosts = [SimHost(url, tok, name, vtep, mode) for name, tok, vtep in sims]
    for h in hosts:  # a cluster booting: its agents start over START_S
        threading.Thread(target=h.watch, args=(random.uniform(0, START_S),), daemon=True).start()
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
            if name in by_name:  # another process's otherwise
                (by_name[name].go_silent if on else by_name[name].resume)()
            conn.send(True)
        elif cmd == "reconnected":  # how many streams were heard from after this moment (monotonic)
            conn.send(sum(h.api.heard > arg for h in hosts))
        elif cmd == "vteps":
            conn.send({h.name: h.vteps_seen.get(arg) for h in hosts})
        elif cmd == "settle":  # before a measured phase: what exists now is never collected again (see main)
            gc.collect()
            gc.freeze()
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
        """Every watchers process's answer, merged (counts summed, per-host maps joined)."""
        for c in self.conns:
            c.send((cmd, arg))
        got = [c.recv() for c in self.conns]
        if isinstance(got[0], dict):
            return {k: v for g in got for k, v in g.items()}
        return all(got) if isinstance(got[0], bool) else sum(got)

    def load(self) -> None:
        a, n = self.args, len(self.hosts)
        tokens = {h: self.ctl.admin.post("/v1/host-tokens", {"host": h})["token"] for h in self.hosts}
        sims = [(h, tok, f"172.16.{i // 250}.{i % 250 + 1}") for i, (h, tok) in enumerate(tokens.items())]
        self.conns, self.procs = [], []
        for k in range(a.sim_procs):
            conn, child = mp.Pipe()
            self.procs.append(mp.Process(target=watchers_main, args=(self.ctl.url, sims[k::a.sim_procs], a.mode, child),
                                         daemon=True))
            self.conns.append(conn)
            self.procs[-1].start()
        t0 = time.monotonic()
        while self.ask("ready") < n:
            if time.monotonic() - t0 > 300:
                raise SystemExit(f"only {self.ask('ready')} of {n} simulated hosts hold a config after 300 s")
            time.sleep(0.5)
        self.res["cold_start_s"] = round(time.monotonic() - t0, 1)
        self.res["cold_start_marked_down"] = sum(h["status"] == "down" for h in self.ctl.admin.get("/v1/hosts"))
        self.log(f"{n} hosts registered and watching in {self.res['cold_start_s']} s, "
                 f"{self.res['cold_start_marked_down']} marked down meanwhile")
        t = self.ctl.admin.post("/v1/tenants", {"name": "fanout"})
        self.ctl.admin.put(f"/v1/tenants/{t['id']}/quotas", {"vpcs": -1, "subnets": -1, "ports": -1, "eips": -1,
                                                              "security_groups": -1, "nat_gateways": -1})
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
        self.nat(tenant)
        time.sleep(3)

    def paced(self, rate: float) -> dict:
        """Creates at `rate` a second for --seconds, each timed to the last affected host. Open loop, as many
        orchestrators would: each create is due at its moment whether or not the ones before have answered (up to
        CREATORS at once), and its API time counts from that moment."""
        clients = threading.local()
        made: list[tuple[str, list[str], float, float]] = []  # port, affected hosts, answered, API s
        failed: list[int] = []

        def create(i: int, due: float, vid: str, host: str) -> None:
            if not hasattr(clients, "orch"):
                clients.orch = self.ctl.orchestrator()
            try:
                p = clients.orch.post("/v1/ports", {"subnet_id": self.subnets[vid], "name": f"r{rate}-{i}",
                                                    "host": host})
            except Exception as e:  # counted, and said once
                if not failed:
                    self.log(f"a create failed: {e}")
                failed.append(i)
                return
            done = time.monotonic()
            made.append((p["id"], self.layout[vid], done, done - due))

        self.ask("settle")
        bytes0 = self.ask("bytes")
        cpu0, _ = cpu_and_rss(self.ctl.proc.pid)
        t_start = time.monotonic()
        vpcs = list(self.layout)
        with ThreadPoolExecutor(CREATORS) as pool:
            i = 0
            while (due := t_start + i / rate) - t_start < self.args.seconds:
                time.sleep(max(0.0, due - time.monotonic()))
                vid = random.choice(vpcs)
                pool.submit(create, i, due, vid, random.choice(self.layout[vid]))
                i += 1
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
        return {"rate": rate, "creates": len(made), "failed": len(failed),
                "achieved_per_s": round(len(made) / elapsed, 1),
                "api_p50_ms": pct(api, 0.5), "api_p99_ms": pct(api, 0.99),
                "last_host_p50_ms": pct(lat, 0.5), "last_host_p99_ms": pct(lat, 0.99),
                "last_host_max_ms": pct(lat, 1.0), "not_delivered": missing,
                "bytes_per_create": round(received / max(1, len(made))),
                "controller_cpu_pct": round(100 * (cpu1 - cpu0) / (elapsed + 5), 1), "controller_rss_mb": rss}

    def nat(self, tenant: Client) -> None:
        """Two NAT gateway instances beating (as gateways do), and --nat-vpcs VPCs whose default route is a NAT
        gateway: what an instance's failure moves (their buckets), in the configs of those VPCs' hosts."""
        adm = self.ctl.admin
        adm.post("/v1/eip-pools", {"cidr": "198.51.96.0/20"})
        self.gateways = {f"gwsim{i}": threading.Event() for i in range(2)}  # set: silent
        for i, g in enumerate(self.gateways):
            adm.post("/v1/hosts", {"name": g, "vtep_ip": f"172.18.0.{i + 1}", "kind": "gateway", "role": "nat"})
        self.stop_beats = threading.Event()
        threading.Thread(target=self.gateway_beats, daemon=True).start()
        self.nat_vpcs = list(self.layout)[:self.args.nat_vpcs]
        for vid in self.nat_vpcs:
            eip = tenant.post("/v1/eips", {})
            gw = tenant.post("/v1/nat-gateways", {"vpc_id": vid, "eip_ids": [eip["id"]]})
            tenant.post(f"/v1/vpcs/{vid}/routes", {"destination": "0.0.0.0/0", "target": f"nat-gateway:{gw['id']}"})
        time.sleep(3)

    def gateway_beats(self) -> None:
        """As instances beat: as often as the answer asks (a fifth of the gateways' silence)."""
        api = Client(self.ctl.url, self.ctl.admin_token)
        every = 0.1
        while not self.stop_beats.wait(every):
            for g, silent in self.gateways.items():
                if not silent.is_set():
                    try:
                        every = api.post(f"/v1/hosts/{g}/status", {"ports": {}})["beat_every"]
                    except Exception:
                        pass

    def received(self, b0: dict) -> tuple[int, int]:
        """(bytes per host, hosts that received anything) since `b0`."""
        b1 = self.ask("bytes")
        got = [b1[h] - b0.get(h, 0) for h in b1]
        return round(sum(got) / len(got)), sum(1 for x in got if x)

    def wait_status(self, name: str, status: str, limit: float) -> float:
        t0 = time.monotonic()
        while self.ctl.admin.get(f"/v1/hosts/{name}")["status"] != status and time.monotonic() - t0 < limit:
            time.sleep(0.1)
        return round(time.monotonic() - t0, 2)

    def topology(self) -> dict:
        out: dict = {}
        b0 = self.ask("bytes")
        t0 = time.monotonic()
        self.ctl.admin.post("/v1/hosts", {"name": "joiner", "vtep_ip": "172.17.0.1"})
        time.sleep(5)
        got = [t - t0 for t in self.ask("vteps", "joiner").values() if t is not None]
        out["host_join_bytes_per_host"], _ = self.received(b0)
        out["host_join_p50_ms"], out["host_join_max_ms"] = pct(got, 0.5), pct(got, 1.0)
        out["host_join_hosts_told"] = len(got)
        self.ctl.admin.delete("/v1/hosts/joiner")  # it has no agent: it would be marked down
        time.sleep(3)  # its removal's deltas: not the next event's

        b0 = self.ask("bytes")
        victim = self.hosts[0]
        self.ask("silent", (victim, True))
        out["host_down_after_s"] = self.wait_status(victim, "down", 40)
        self.ask("silent", (victim, False))
        out["host_up_after_s"] = self.wait_status(victim, "up", 20)
        time.sleep(3)
        out["host_down_up_bytes_per_host"], out["host_down_up_hosts_told"] = self.received(b0)

        b0 = self.ask("bytes")
        g = next(iter(self.gateways))
        self.gateways[g].set()
        out["gateway_down_after_s"] = self.wait_status(g, "down", 20)
        time.sleep(3)
        out["gateway_fail_bytes_per_host"], out["gateway_fail_hosts_told"] = self.received(b0)
        self.gateways[g].clear()
        self.wait_status(g, "up", 10)
        time.sleep(2)

        out |= self.reconnect()
        # idle: a whole refresh period, so that the hosts' periodic reports count at their average, not as luck
        cpu0, _ = cpu_and_rss(self.ctl.proc.pid)
        time.sleep(IDLE_S)
        cpu1, rss = cpu_and_rss(self.ctl.proc.pid)
        out["idle_cpu_pct"], out["idle_rss_mb"] = round(100 * (cpu1 - cpu0) / IDLE_S, 1), rss
        return out

    def reconnect(self) -> dict:
        """The controller restarted: every watcher reconnects at once. Until every stream is heard from again
        (stream mode), and until a port created right after the restart is held by every host of its VPC; and
        whether anyone was marked down meanwhile."""
        t0 = time.monotonic()
        self.ctl.restart()
        vid = next(iter(self.layout))
        p = self.ctl.orchestrator().post("/v1/ports", {"subnet_id": self.subnets[vid], "name": "after-restart",
                                                       "host": self.layout[vid][0]})
        n = len(self.hosts)
        while self.args.mode == "stream" and self.ask("reconnected", t0) < n and time.monotonic() - t0 < 120:
            time.sleep(0.2)
        reconnected = round(time.monotonic() - t0, 1)
        while time.monotonic() - t0 < 120:
            seen = self.ask("seen")
            if all(p["id"] in seen[h] for h in self.layout[vid]):
                break
            time.sleep(0.2)
        delivered = round(time.monotonic() - t0, 1)
        time.sleep(max(0.0, 16 - (time.monotonic() - t0)))  # a whole silence after the restart: any down shows
        hosts = self.ctl.admin.get("/v1/hosts")
        return {**{f"restart_{k}": v for k, v in self.ctl.restart_phases.items()},
                "reconnect_s": reconnected, "reconnect_streams": self.ask("reconnected", t0),
                "reconnect_port_s": delivered, "reconnect_marked_down": sum(h["status"] == "down" for h in hosts)}

    def close(self) -> None:
        if hasattr(self, "stop_beats"):
            self.stop_beats.set()
        try:
            self.ask("stop")
        except Exception:
            pass
        for p in getattr(self, "procs", ()):
            p.kill()
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
    ap.add_argument("--nat-vpcs", type=int, default=50, help="VPCs with a NAT gateway as their default route")
    ap.add_argument("--sim-procs", type=int, default=4,
                    help="processes the simulated hosts are spread over (one Python process of 1,000 agents is "
                         "bound by its own GIL: a cold start measured it, not the controller)")
    ap.add_argument("--mode", choices=("stream", "poll"), default="stream",
                    help="how the simulated hosts watch: the config stream (as the agent does) or the long-poll")
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
        print(f"topology ({res['backend']}): a host joining {res['host_join_bytes_per_host']} bytes per other host "
              f"(all {res['host_join_hosts_told']} told in {res['host_join_p50_ms']} / {res['host_join_max_ms']} ms "
              f"p50/max); a host down ({res['host_down_after_s']} s) and up {res['host_down_up_bytes_per_host']} bytes "
              f"per host ({res['host_down_up_hosts_told']} told); a gateway instance failing "
              f"{res['gateway_fail_bytes_per_host']} bytes per host ({res['gateway_fail_hosts_told']} told); "
              f"controller restart (stop {res['restart_stop_s']} s, start {res['restart_start_s']} s): "
              f"{res['reconnect_streams']} streams back in {res['reconnect_s']} s, a port "
              f"through it at its VPC's hosts in {res['reconnect_port_s']} s, "
              f"{res['reconnect_marked_down']} marked down; cold start (all registering within {START_S:g} s): "
              f"{res['cold_start_s']} s, {res['cold_start_marked_down']} marked down; "
              f"idle CPU {res['idle_cpu_pct']}% of a core, "
              f"RSS {res['idle_rss_mb']} MB; load {res['load_s']} s")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
