"""Service endpoints benchmark: a VM reaching a service through its endpoint, against the same VM reaching the same
service routed without translation, in the same run; and an endpoint's creation until its first packet arrives, with
T tenants holding an endpoint each.

    python bench/services.py [--seconds 5] [--wire-reps 3] [--tenants 1000] [--reps 20]
                             [--backend sqlite|postgres] [--fastpath auto] [--skip-wire] [--skip-scale]

Wire rows (topologies/gwlab.py's three namespaces): the hypervisor stand-in's kernel VXLAN device is the VM
(10.0.1.5, VNI 1001); the server (198.51.100.1) is the service.
  (a) baseline: the Linux kernel decapsulates and routes to the server, no translation (the server routes the
      VPC's addresses back to it)
  (b) a tianji instance of role `service` (config file) serving endpoint 10.0.1.9 for the server, from source
      198.51.100.200 (what the service sees)
Each: TCP throughput (iperf3, one stream, then 4) and new TCP connections/s (4 clients connecting and closing),
`--wire-reps` times, (a) and (b) interleaved; the medians are compared (this 2-core machine's runs vary by 30 %).

Scale row: a controller (SQLite or PostgreSQL) holding T tenants, each a VPC, a subnet and an endpoint of the
operator's service; the lab's instance watches it. Then, `--reps` times, a new tenant creates its endpoint and the
stand-in sends as its VM every 2 ms to the endpoint's address: seconds from the API call's start until the first
probe reaches the server from the endpoint's source address (p50, p99, max).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import struct
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.control_plane import ControllerProcess, heartbeat_process
from bench.gateway import CLIENT_PROG, SERVER_PROG
from bench.gateway_scale import PROBE_PORT, Prober, ipv4
from topologies import gwlab
from topologies.gwlab import GatewayLab
from topologies.netns import sh

EP_IP, EP_MAC, SOURCE = "10.0.1.9", "02:00:00:00:01:09", "198.51.100.200"
GW_EXT = "198.51.100.254"  # the kernel router's address on the service side (baseline)
SOURCE_POOL = "100.127.0.0/20"  # the endpoints' sources (on-link at the server: the instance answers ARP for them)
now = time.monotonic


# --- wire -------------------------------------------------------------------------------------------------------
def service_config() -> dict:
    vm = {"port_id": "p1", "vpc_id": "v1", "vni": gwlab.VNI, "ip": gwlab.VM_IP, "mac": gwlab.VM_MAC, "host": "hv",
          "vtep_ip": gwlab.CLIENT_VTEP}
    served = {"id": "ep-bench", "vni": gwlab.VNI, "ip": EP_IP, "mac": EP_MAC, "source": SOURCE,
              "addresses": [gwlab.SERVER_IP], "ports": [{"protocol": "tcp", "port": p} for p in (5201, 7001)],
              "rules": [{"protocol": "any", "cidrs": ["0.0.0.0/0"]}]}
    return {"name": "lab", "revision": 1, "vtep_ip": gwlab.GW_VTEP, "eips": [SOURCE], "endpoints": [vm],
            "vpcs": [{"id": "v1", "vni": gwlab.VNI, "router_mac": gwlab.ROUTER_MAC}],
            "vteps": [{"host": "hv", "ip": gwlab.CLIENT_VTEP}], "services": [served]}


def up(lab: GatewayLab, kind: str, fastpath: str) -> str:
    """The lab as `kind` (kernel: routing; tianji: a service instance); the address the VM talks to."""
    lab.plumb(kind)
    if kind == "kernel":
        g = lab.gw
        sh("ip", "-n", g, "link", "add", "vx0", "address", gwlab.ROUTER_MAC, "type", "vxlan", "id", str(gwlab.VNI),
           "local", gwlab.GW_VTEP, "remote", gwlab.CLIENT_VTEP, "dstport", "4789", "nolearning")
        sh("ip", "-n", g, "addr", "add", f"{gwlab.ROUTER_IP}/24", "dev", "vx0")
        sh("ip", "-n", g, "link", "set", "vx0", "up")
        sh("ip", "-n", g, "neigh", "replace", gwlab.VM_IP, "lladdr", gwlab.VM_MAC, "dev", "vx0", "nud", "permanent")
        sh("ip", "-n", g, "addr", "add", f"{GW_EXT}/24", "dev", "ext0")
        sh("ip", "netns", "exec", g, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        cpu = max(os.sched_getaffinity(0))  # forwarding on its own core, as the instance's loop is
        sh("ip", "netns", "exec", g, "sh", "-c", f"echo {1 << cpu:x} > /sys/class/net/ul0/queues/rx-0/rps_cpus")
        sh("ip", "-n", lab.server, "route", "add", "10.0.1.0/24", "via", GW_EXT)
        return gwlab.SERVER_IP
    cfg = lab.dir / "config.json"
    cfg.write_text(json.dumps(service_config()))
    lab._start(fastpath, "--config-file", str(cfg), role="service")
    deadline = time.time() + 30
    while lab.status().get("revision") != 1:
        if time.time() > deadline or lab.proc.poll() is not None:
            raise RuntimeError(f"lab instance did not start:\n{lab.log.read_text()[-2000:]}")
        time.sleep(0.2)
    # the vSwitch answers ARP for the endpoint with its MAC; the stand-in is told
    sh("ip", "-n", lab.client, "neigh", "replace", EP_IP, "lladdr", EP_MAC, "dev", "vx0", "nud", "permanent")
    return EP_IP


def iperf(lab: GatewayLab, target: str, seconds: float, streams: int) -> float:
    srv = subprocess.Popen(["ip", "netns", "exec", lab.server, "iperf3", "-s", "-1", "-p", "5201"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.4)
    out = sh("ip", "netns", "exec", lab.client, "iperf3", "-c", target, "-p", "5201", "-t", str(seconds), "-P",
             str(streams), "-J", check=False, timeout=seconds + 30).stdout
    srv.wait(10)
    try:
        return json.loads(out)["end"]["sum_received"]["bits_per_second"]
    except (ValueError, KeyError):
        return 0.0


def connections(lab: GatewayLab, target: str, seconds: float, clients: int = 4) -> float:
    srv = subprocess.Popen(["ip", "netns", "exec", lab.server, sys.executable, "-c", SERVER_PROG],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        procs = [subprocess.Popen(["ip", "netns", "exec", lab.client, sys.executable, "-c", CLIENT_PROG, str(seconds),
                                   target], stdout=subprocess.PIPE, text=True) for _ in range(clients)]
        return sum(int(p.communicate()[0].strip() or 0) for p in procs) / seconds
    finally:
        srv.kill()
        srv.wait()


def wire(kind: str, fastpath: str, seconds: float) -> dict:
    lab = GatewayLab("tjsv")
    try:
        target = up(lab, kind, fastpath)
        used = "Linux kernel, routed" if kind == "kernel" else f"service instance, {lab.status()['fastpath']}"
        return {"path": used, "tcp_1": iperf(lab, target, seconds, 1), "tcp_4": iperf(lab, target, seconds, 4),
                "conns_per_s": connections(lab, target, seconds)}
    finally:
        lab.down()


def median_row(rows: list[dict]) -> dict:
    return {"path": rows[0]["path"]} | {k: statistics.median(r[k] for r in rows)
                                        for k in ("tcp_1", "tcp_4", "conns_per_s")}


# --- scale ------------------------------------------------------------------------------------------------------
class EndpointProber(Prober):
    """gateway_scale's prober (the stand-in sends as a VM, the server records each probe's arrival and source),
    sending to an endpoint's address instead of the server's."""

    def endpoint_frame(self, vni: int, vm: dict, ep: dict, sport: int, tag: bytes) -> bytes:
        udp = struct.pack("!HHHH", sport, PROBE_PORT, 8 + len(tag), 0) + tag
        # to the endpoint's MAC as the VM's switch sends it (the instance goes by VNI and address: any MAC here)
        inner = bytes.fromhex("02aa00000009") + bytes.fromhex(vm["mac"].replace(":", "")) + \
            b"\x08\x00" + ipv4(vm["ip"], ep["address"], 17, udp)
        vx = b"\x08\0\0\0" + vni.to_bytes(3, "big") + b"\0" + inner
        outer_udp = struct.pack("!HHHH", 49152 + sport % 16384, 4789, 8 + len(vx), 0) + vx
        return self.outer + ipv4(gwlab.CLIENT_VTEP, gwlab.GW_VTEP, 17, outer_udp)

    def until_through(self, vni: int, vm: dict, ep: dict, t0: float, timeout: float = 30) -> float:
        deadline, seq, tags = now() + timeout, 0, []
        while now() < deadline:
            tag = f"{ep['id']}.{seq}".encode()
            tags.append(tag)
            self.tx.send(self.endpoint_frame(vni, vm, ep, 20000 + seq % 40000, tag))
            seq += 1
            with self.cond:
                self.cond.wait(0.002)
                got = [self.seen[t][0] for t in tags if t in self.seen and self.seen[t][1] == ep["source_address"]]
            if got:
                return min(got) - t0
        raise TimeoutError(f"no probe through endpoint {ep['id']} within {timeout} s")


def scale(tenants: int, reps: int, backend: str, fastpath: str) -> dict:
    pg = None
    if backend == "postgres":
        from tests.support.controller import PgDatabase

        pg = PgDatabase()
    ctl = ControllerProcess(pg.url if pg else None, 2 if pg else 1, listen="0.0.0.0",
                            env={"TIANJI_SERVICE_SOURCE_POOL": SOURCE_POOL})
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    lab = GatewayLab("tjss")
    res: dict = {"tenants": tenants, "backend": backend}
    try:
        adm = ctl.admin
        adm.post("/v1/hosts", {"name": "hv0", "vtep_ip": gwlab.CLIENT_VTEP})
        beats = ctx.Process(target=heartbeat_process, args=(ctl.url, ctl.admin_token, ["hv0"], stop))
        beats.start()
        svc = adm.post("/v1/services", {"name": "store", "addresses": [gwlab.SERVER_IP],
                                        "ports": [{"protocol": "udp", "port": PROBE_PORT}]})
        token = adm.post("/v1/host-tokens", {"host": "svc1", "kind": "gateway", "role": "service"})["token"]
        lab.up_with_controller(ctl.port, token, fastpath, name="svc1", eips=SOURCE_POOL, role="service")

        def tenant(i: int, endpoint: bool) -> dict:
            c = ctl.tenant(f"t{i}")
            vpc = c.post("/v1/vpcs", {"name": "v", "cidr": "10.0.0.0/16"})
            sn = c.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.0.1.0/24"})
            out = {"c": c, "vpc": vpc, "subnet": sn}
            if endpoint:
                out["ep"] = c.post("/v1/service-endpoints", {"vpc_id": vpc["id"], "subnet_id": sn["id"],
                                                             "service_id": svc["id"]})
            return out

        t0 = now()
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda i: tenant(i, True), range(tenants)))
            fresh = list(ex.map(lambda i: tenant(tenants + i, False), range(reps)))
        res["load_s"] = round(now() - t0, 1)
        print(f"[services] {tenants} tenants with an endpoint loaded in {res['load_s']} s", flush=True)
        deadline = now() + 600
        while lab.status().get("endpoints", 0) < tenants and now() < deadline:
            time.sleep(0.5)
        res["fastpath"] = lab.status().get("fastpath", "")
        orch = ctl.orchestrator()
        prober = EndpointProber(lab)
        took = []
        for f in fresh:  # the tenant's VM on the stand-in, then its endpoint: create -> first packet through
            vm = orch.post("/v1/ports", {"subnet_id": f["subnet"]["id"], "name": "vm", "host": "hv0"})
            time.sleep(0.3)
            t1 = now()
            ep = f["c"].post("/v1/service-endpoints", {"vpc_id": f["vpc"]["id"], "subnet_id": f["subnet"]["id"],
                                                       "service_id": svc["id"]})
            took.append(prober.until_through(f["vpc"]["vni"], vm, ep, t1))
        took.sort()
        res["create_to_first_packet_s"] = {"p50": round(statistics.median(took), 3),
                                           "p99": round(took[min(len(took) - 1, int(0.99 * len(took)))], 3),
                                           "max": round(took[-1], 3), "n": len(took)}
        return res
    finally:
        stop.set()
        lab.down()
        ctl.stop()
        if pg:
            pg.drop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--wire-reps", type=int, default=3)
    ap.add_argument("--tenants", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--backend", default="sqlite", choices=("sqlite", "postgres"))
    ap.add_argument("--fastpath", default="auto")
    ap.add_argument("--skip-wire", action="store_true")
    ap.add_argument("--skip-scale", action="store_true")
    a = ap.parse_args()
    out: dict = {}
    if not a.skip_wire:
        runs: dict[str, list[dict]] = {"kernel": [], "tianji": []}
        for rep in range(a.wire_reps):
            for kind in runs:
                row = wire(kind, a.fastpath, a.seconds)
                runs[kind].append(row)
                print(f"run {rep + 1}/{a.wire_reps} {row['path']:60} TCP 1 stream {row['tcp_1'] / 1e6:8.0f} Mbit/s, "
                      f"4 streams {row['tcp_4'] / 1e6:8.0f} Mbit/s, {row['conns_per_s']:7.0f} new connections/s",
                      flush=True)
        base, svc = (median_row(runs[k]) for k in ("kernel", "tianji"))
        out["wire"] = {"baseline": base, "endpoint": svc, "runs": runs,
                       "ratio": {k: round(svc[k] / base[k], 3) if base[k] else None
                                 for k in ("tcp_1", "tcp_4", "conns_per_s")}}
        print("ratios of the medians (endpoint / routed):", out["wire"]["ratio"],
              "(goals: throughput >= 0.9, connections >= 0.8)")
    if not a.skip_scale:
        out["scale"] = scale(a.tenants, a.reps, a.backend, a.fastpath)
        print("endpoint create -> first packet through:", out["scale"]["create_to_first_packet_s"],
              f"with {a.tenants} tenants holding an endpoint each (goal: p99 < 1 s)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
