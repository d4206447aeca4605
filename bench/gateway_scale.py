"""NAT gateway programming at scale: one instance (DPDK path where it runs) watching a controller that holds T
tenants, measured as the user sees it, with packets.

    python bench/gateway.py --scale 100,1000 [--backend postgres|sqlite] [--reps 20]

Workload (the issue's): T tenants, each a VPC with 2 subnets and 10 ports on 50 hosts (port 0 on `hv0`, the
hypervisor stand-in of topologies/gwlab.py, which can send as its VMs), a NAT gateway with an EIP and an SNAT
rule, and one port with its own EIP; 10 more tenants without NAT. Measured:
  (1) a new NAT gateway + EIP + SNAT rule (a fresh tenant's) -> its VM's packets leave translated (median, max)
  (2) an EIP allocated and associated to a port -> its packets leave with that EIP
  (3) writes that do not concern the instance (ports in tenants without NAT, security group rules in tenants with
      NAT): the instance's config downloads, applies and gratuitous ARPs per write (the goal: none)
  (4) a write that does concern it (a port bound in a NAT tenant) while it holds NAT mappings: the instance's
      time to apply it (status `last_applies_ms`) and the controller's to compile it (`Server-Timing`)
  (5) the instance's whole config: size, and the controller's time to answer it (cold and warm)
With (3) and (4): what crossed into C per write (calls and bytes of configuration: the data plane's endpoints per
VPC, the NAT's policy per VPC; status `dataplane_crossed`, `nat_crossed`), against what C holds in all.
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing as mp
import os
import socket
import statistics
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from bench.control_plane import ControllerProcess, heartbeat_process
from bench.gateway import link_mac
from tianji.api_client import Client
from tianji.inet import checksum
from topologies import gwlab
from topologies.gwlab import GatewayLab

HOSTS, PORTS, EXTRA = 50, 10, 10
EIP_POOL = "198.18.0.0/20"
PROBE_PORT = 9999
now = time.monotonic
_libc = ctypes.CDLL("libc.so.6", use_errno=True)
CLONE_NEWNET = 0x40000000


def socket_in(ns: str, *args: int) -> socket.socket:
    """A socket made inside network namespace `ns` (by a thread that enters it: a namespace is per thread)."""
    out: list = []

    def make() -> None:
        fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
        try:
            if _libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns {ns}")
            out.append(socket.socket(*args))
        finally:
            os.close(fd)

    t = threading.Thread(target=make)
    t.start()
    t.join()
    return out[0]


def ipv4(src: str, dst: str, proto: int, payload: bytes) -> bytes:
    h = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 0, 0x4000, 64, proto, 0,
                    socket.inet_aton(src), socket.inet_aton(dst))
    return h[:10] + struct.pack("!H", checksum(h)) + h[12:] + payload


class Prober:
    """The hypervisor stand-in sends as a VM (VXLAN with its VPC's VNI to the gateway); the server records when
    each probe arrives and with which source address."""

    def __init__(self, lab: GatewayLab) -> None:
        self.tx = socket_in(lab.client, socket.AF_PACKET, socket.SOCK_RAW)
        self.tx.bind(("ul0", 0))
        self.outer = (bytes.fromhex(link_mac(lab.gw, "ul0").replace(":", ""))
                      + bytes.fromhex(link_mac(lab.client, "ul0").replace(":", "")) + b"\x08\x00")
        self.rx = socket_in(lab.server, socket.AF_INET, socket.SOCK_DGRAM)
        self.rx.bind(("0.0.0.0", PROBE_PORT))
        self.rx.settimeout(0.5)
        self.seen: dict[bytes, tuple[float, str]] = {}
        self.cond = threading.Condition()
        threading.Thread(target=self._receive, daemon=True).start()

    def _receive(self) -> None:
        while True:
            try:
                data, (src, _) = self.rx.recvfrom(2048)
            except TimeoutError:
                continue
            except OSError:
                return
            with self.cond:
                self.seen.setdefault(data, (now(), src))
                self.cond.notify_all()

    def frame(self, vni: int, mac: str, router_mac: str, ip: str, sport: int, tag: bytes) -> bytes:
        inner_udp = struct.pack("!HHHH", sport, PROBE_PORT, 8 + len(tag), 0) + tag
        inner = bytes.fromhex(router_mac.replace(":", "")) + bytes.fromhex(mac.replace(":", "")) + b"\x08\x00" \
            + ipv4(ip, gwlab.SERVER_IP, 17, inner_udp)
        vx = b"\x08\0\0\0" + vni.to_bytes(3, "big") + b"\0" + inner
        udp = struct.pack("!HHHH", 49152 + sport % 16384, 4789, 8 + len(vx), 0) + vx
        return self.outer + ipv4(gwlab.CLIENT_VTEP, gwlab.GW_VTEP, 17, udp)

    def until_translated(self, vni: int, vm: dict, router_mac: str, eip: str, t0: float, name: str,
                         timeout: float = 30) -> float:
        """Send as `vm` every 2 ms, each probe a new flow, until one reaches the server from `eip` (earlier ones
        may leave by another translation, e.g. the SNAT rule before a port's own EIP); seconds from t0."""
        deadline, seq = now() + timeout, 0
        tags: list[bytes] = []
        while now() < deadline:
            tag = f"{name}.{seq}".encode()
            tags.append(tag)
            self.tx.send(self.frame(vni, vm["mac"], router_mac, vm["ip"], 20000 + seq % 40000, tag))
            seq += 1
            with self.cond:
                self.cond.wait(0.002)
                got = [self.seen[t][0] for t in tags if t in self.seen and self.seen[t][1] == eip]
            if got:
                return min(got) - t0
        raise TimeoutError(f"no probe from {vm['ip']} left translated to {eip} in {timeout} s")


class ScaleRun:
    def __init__(self, tenants: int, backend: str, reps: int, fastpath: str) -> None:
        self.T, self.backend, self.reps, self.fastpath = tenants, backend, reps, fastpath
        self.res: dict = {"tenants": tenants, "backend": backend}

    def log(self, *a: object) -> None:
        print(f"[gateway {self.backend} {self.T} tenants]", *a, flush=True)

    def tenant(self, t: int, nat: bool) -> dict:
        c = self.ctl.tenant(f"{'n' if nat else 'x'}{t}")
        vpc = c.post("/v1/vpcs", {"name": "v", "cidr": "10.0.0.0/16"})
        out: dict = {"c": c, "vpc": vpc, "subnets": [], "ports": []}
        placer = self.ctl.orchestrator()  # one client (and connection) per tenant, as the tenant's own
        for s in range(2):
            sn = c.post("/v1/subnets", {"vpc_id": vpc["id"], "name": f"s{s}", "cidr": f"10.0.{s + 1}.0/24"})
            body = [{"subnet_id": sn["id"], "name": f"p{s}{p}",
                     "host": "hv0" if s == p == 0 else f"h{(t * PORTS + s * 5 + p) % HOSTS:02d}"} for p in range(5)]
            out["subnets"].append(sn)
            out["ports"] += placer.post("/v1/ports/bulk", {"ports": body})
        if nat:
            self.nat(out)
            own = c.post("/v1/eips", {})
            c.post(f"/v1/eips/{own['id']}/associate", {"port_id": out["ports"][1]["id"]})
        return out

    @staticmethod
    def nat(ten: dict) -> str:
        """A NAT gateway with a new EIP and an SNAT rule for the first subnet; returns the EIP's address."""
        c, vpc = ten["c"], ten["vpc"]
        eip = c.post("/v1/eips", {})
        gw = c.post("/v1/nat-gateways", {"vpc_id": vpc["id"], "eip_ids": [eip["id"]]})
        c.post(f"/v1/nat-gateways/{gw['id']}/snat-rules", {"subnet_id": ten["subnets"][0]["id"],
                                                            "eip_ids": [eip["id"]]})
        return eip["address"]

    def counters(self) -> dict[str, int]:
        st = self.lab.status()
        c = st.get("counters", {})
        out = {k: c.get(k, 0) for k in ("config_downloads", "config_applies", "gratuitous_arps")}
        for part in ("dataplane_crossed", "nat_crossed"):  # configuration calls and bytes into C
            for k, v in st.get(part, {}).items():
                out[f"c_{k}"] = out.get(f"c_{k}", 0) + v
        return {"c_calls": 0, "c_bytes": 0} | out

    def held(self) -> str:
        h = self.lab.status().get("dataplane_held", {})
        return f"C holds {h.get('vpcs', '?')} VPCs, {h.get('endpoints', '?')} endpoints"

    def settle(self, eips: int, timeout: float = 300) -> None:
        deadline = now() + timeout
        while len(self.lab.status().get("eips", [])) < eips:
            if now() > deadline:
                raise TimeoutError(f"the instance serves {len(self.lab.status().get('eips', []))} of {eips} EIPs")
            time.sleep(0.2)
        time.sleep(2)

    def run(self) -> dict:
        pg = None
        if self.backend == "postgres":
            from tests.support.controller import PgDatabase

            pg = PgDatabase()
        self.ctl = ControllerProcess(pg.url if pg else None, 2 if pg else 1, listen="0.0.0.0")
        ctx = mp.get_context("spawn")
        stop = ctx.Event()
        self.lab = GatewayLab("tjgs")
        try:
            adm = self.ctl.admin
            adm.post("/v1/eip-pools", {"cidr": EIP_POOL})
            adm.post("/v1/hosts", {"name": "hv0", "vtep_ip": gwlab.CLIENT_VTEP})
            hosts = [f"h{i:02d}" for i in range(HOSTS)]
            for i, h in enumerate(hosts):
                adm.post("/v1/hosts", {"name": h, "vtep_ip": f"172.30.0.{10 + i}"})
            beats = ctx.Process(target=heartbeat_process, args=(self.ctl.url, self.ctl.admin_token,
                                                                ["hv0", *hosts], stop))
            beats.start()
            token = adm.post("/v1/host-tokens", {"host": "gw1", "kind": "gateway"})["token"]
            self.lab.up_with_controller(self.ctl.port, token, self.fastpath, eips=EIP_POOL)
            t0 = now()
            with ThreadPoolExecutor(8) as ex:
                nat = list(ex.map(lambda t: self.tenant(t, True), range(self.T)))
                plain = list(ex.map(lambda t: self.tenant(t, False), range(EXTRA)))
                fresh = list(ex.map(lambda t: self.tenant(self.T + t, False), range(self.reps)))
            self.log(f"loaded in {now() - t0:.1f} s; waiting for the instance ...")
            self.settle(2 * self.T)
            self.res["load_s"] = round(now() - t0, 1)
            self.res["fastpath"] = self.lab.status().get("fastpath", "")
            prober = Prober(self.lab)
            self.whole_config()
            self.unrelated(nat, plain)
            self.new_nat(fresh, prober)
            self.new_eip(nat, prober)
            self.with_mappings(nat, prober)
            return self.res
        finally:
            stop.set()
            self.lab.down()
            self.ctl.stop()
            if pg and os.environ.get("TIANJI_BENCH_KEEP_DB"):
                self.log(f"database kept (TIANJI_BENCH_KEEP_DB): {pg.url}")
            elif pg:
                pg.drop()

    def whole_config(self) -> None:
        http = Client(self.ctl.url, self.ctl.admin_token, timeout=120)
        times = []
        for _ in range(3):
            t0 = now()
            cfg = http.get("/v1/gateways/gw1/config")
            times.append(now() - t0)
        size = len(json.dumps(cfg))
        raw = http.http.get("/v1/gateways/gw1/config/delta", params={"after": -1})
        rev, digest = raw.headers["X-Tianji-Revision"], raw.headers["X-Tianji-Config-Digest"]
        idle = []
        for _ in range(10):  # what every wake costs the controller when the instance's config is unchanged
            t0 = now()
            r = http.http.get("/v1/gateways/gw1/config/delta", params={"after": rev, "digest": digest, "timeout": 0})
            idle.append(now() - t0)
            assert r.status_code == 304, r.status_code
        self.res["config"] = {"kb": round(size / 1024), "first_ms": round(times[0] * 1000),
                              "warm_ms": round(min(times[1:]) * 1000), "endpoints": len(cfg["endpoints"]),
                              "unchanged_check_ms": round(statistics.median(idle) * 1000, 1)}
        self.log(f"(5) the instance's whole config: {size / 1024:.0f} KB, {len(cfg['endpoints'])} endpoints; "
                 f"answered in {times[0] * 1000:.0f} ms, then {min(times[1:]) * 1000:.0f} ms; the watch finding "
                 f"it unchanged: {statistics.median(idle) * 1000:.1f} ms")

    def unrelated(self, nat: list, plain: list) -> None:
        before, writes = self.counters(), 0
        placer = self.ctl.orchestrator()
        for i in range(20):
            ten = plain[i % len(plain)]
            placer.post("/v1/ports", {"subnet_id": ten["subnets"][0]["id"], "name": f"u{i}",
                                      "host": f"h{i % HOSTS:02d}"})
            ten = nat[(i * 37) % len(nat)]
            ten["c"].post(f"/v1/security-groups/{ten['vpc']['default_security_group_id']}/rules",
                          {"direction": "ingress", "protocol": "tcp", "port_range_min": 1000 + i,
                           "port_range_max": 1000 + i})
            writes += 2
        time.sleep(3)
        after = self.counters()
        per = {k: round((after[k] - before[k]) / writes, 3) for k in before}
        self.res["unrelated_per_write"] = per
        self.log(f"(3) {writes} writes that do not concern the instance (ports in tenants without NAT, SG rules in "
                 f"tenants with NAT): per write {per} ({self.held()})")

    def new_nat(self, fresh: list, prober: Prober) -> None:
        xs, api = [], []
        for r, ten in enumerate(fresh):
            vm = ten["ports"][0]
            t0 = now()
            eip = self.nat(ten)
            api.append(now() - t0)
            xs.append(prober.until_translated(ten["vpc"]["vni"], vm, ten["vpc"]["router_mac"], eip, t0, f"nat{r}"))
            time.sleep(0.1)
        st = self.lab.status()
        self.res["new_nat_gateway_ms"] = {**stats(xs), "of_which_api_p50_ms": round(statistics.median(api) * 1000, 1)}
        self.log(f"    the instance's last answers: compiled by the controller in {st.get('last_compiles_ms')[-6:]} "
                 f"ms, applied in {st.get('last_applies_ms')[-6:]} ms")
        self.log(f"(1) new NAT gateway + EIP + SNAT rule -> translating: {fmt(xs)} (the three API calls: p50 "
                 f"{statistics.median(api) * 1000:.1f} ms)")

    def new_eip(self, nat: list, prober: Prober) -> None:
        xs = []
        for r in range(self.reps):
            ten = nat[(r * 7919) % len(nat)]
            vm = ten["ports"][0]  # on hv0, translated by the SNAT rule until now
            t0 = now()
            eip = ten["c"].post("/v1/eips", {})
            ten["c"].post(f"/v1/eips/{eip['id']}/associate", {"port_id": vm["id"]})
            xs.append(prober.until_translated(ten["vpc"]["vni"], vm, ten["vpc"]["router_mac"], eip["address"], t0,
                                              f"eip{r}"))
            time.sleep(0.1)
        self.res["eip_associated_ms"] = stats(xs)
        self.log(f"(2) EIP allocated and associated -> translating: {fmt(xs)}")

    def with_mappings(self, nat: list, prober: Prober) -> None:
        """Mappings first (5 flows from the hv0 VM of every NAT tenant), then writes that concern the instance."""
        for i, ten in enumerate(nat):
            vm = ten["ports"][0]
            for f in range(5):
                prober.tx.send(prober.frame(ten["vpc"]["vni"], vm["mac"], ten["vpc"]["router_mac"], vm["ip"],
                                            40000 + f, f"m{i}.{f}".encode()))
            if i % 50 == 49:
                time.sleep(0.01)
        time.sleep(1)
        held = self.lab.status().get("mappings", 0)
        n = 20
        before = self.counters()
        placer = self.ctl.orchestrator()
        for i in range(n):
            ten = nat[(i * 13) % len(nat)]
            placer.post("/v1/ports", {"subnet_id": ten["subnets"][1]["id"], "name": f"w{i}",
                                      "host": f"h{i % HOSTS:02d}"})
            time.sleep(0.2)
        time.sleep(1.5)
        st = self.lab.status()
        after = self.counters()
        per = {k: round((after[k] - before[k]) / n, 2) for k in before}
        applies = st.get("last_applies_ms", [])[-n:]
        compiles = st.get("last_compiles_ms", [])[-n:]
        self.res["related_write"] = {"mappings": held, "apply_p50_ms": statistics.median(applies),
                                     "compile_p50_ms": statistics.median(compiles), **per,
                                     "held": self.lab.status().get("dataplane_held", {})}
        self.log(f"(4) a port bound in a NAT tenant, {held} mappings held: the instance applies its section in "
                 f"{statistics.median(applies):.1f} ms p50 (max {max(applies):.1f}), the controller compiles it in "
                 f"{statistics.median(compiles):.1f} ms p50; per write {per} ({self.held()})")


def stats(xs: list[float]) -> dict:
    ms = sorted(x * 1000 for x in xs)
    return {"p50_ms": round(statistics.median(ms), 1), "max_ms": round(ms[-1], 1), "n": len(ms)}


def fmt(xs: list[float]) -> str:
    s = stats(xs)
    return f"p50 {s['p50_ms']:.1f} ms, max {s['max_ms']:.1f} ms over {s['n']}"


def main(sizes: list[int], backend: str, reps: int, fastpath: str) -> None:
    out = [ScaleRun(t, backend, reps, fastpath).run() for t in sizes]
    print(json.dumps(out, indent=1))


__all__ = ["main"]
