"""Programming at scale, end to end, on the OVN anchor's workload, with one real agent and Open vSwitch.

    python bench/scale.py [--sizes 2000,10000,20000] [--backends sqlite,postgres] [--reps 20]

Workload (OVN's own scale workload): T = ports/100 tenants, each a VPC (a /20) with 4 subnets of
25 ports; consecutive tenants peered (an accepted cross-tenant peering, routes implicit). Ports with p % 10 == 0
(3 per subnet, 12 %) are bound to the measured hypervisor `hv0` (a private ovs-vswitchd, userspace datapath,
and a real `tianji agent`), the others to 99 registered hosts that heartbeat. Every port is in its VPC's default
security group (members talk to each other), which OVN's workload does not have. The VIFs are OVS internal
interfaces named by `iface-id`, plugged after the API created their ports (Nova's order: the port id comes from
the API).

Measured, as the user sees it (the switch itself is watched through an OpenFlow flow monitor, `ovs-ofctl
monitor br-int watch:`, and `ovs-ofctl dump-aggregate`):
  (a) bulk: the API load + plugging every VIF -> every flow on hv0's switch
  (b) one port created on hv0 -> its ARP flows on the switch (all a port has before its VIF exists)
  (c) one port created on another host -> hv0's flow that sends to it
  (d) a VIF plugged for an existing port -> its flows (classification, port security, delivery)
  (e) peak RSS of the controller, the agent and ovs-vswitchd
After each phase: the switch's flows equal the flows computed from scratch (`compute_flows`) from the controller's
config and the switch's interfaces, and every local port has its port-security and delivery flows.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import multiprocessing as mp
import os
import pty
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.control_plane import ControllerProcess, heartbeat_process
from tests.support.controller import PgDatabase
from topologies.hosts import Fabric
from topologies.machines import Hypervisor

S, P, BIND_EVERY, OTHER_HOSTS = 4, 25, 10, 99
# OVN 23.03 on this machine kind (measured once with OVN's benchmark, not rerun here), T x 4 x 25, seconds:
# (a) bulk, (b) port add median, (d) VIF plug
OVN = {2000: {"a": 10.2, "b": 0.96, "d": 0.14}, 10000: {"a": 84.0, "b": 4.15, "d": 0.71},
       20000: {"a": 331.0, "b": 9.17, "d": None}}
now = time.monotonic


def tenant_net(t: int) -> ipaddress.IPv4Network:
    return ipaddress.ip_network((int(ipaddress.ip_address("10.0.0.0")) + t * 4096, 20))


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(x) for x in out]


class FlowWatch(threading.Thread):
    """When flows appear on the switch, pushed by an OpenFlow flow monitor (`ovs-ofctl monitor br-int watch:`,
    through the bridge's management socket). It runs on a pseudo-terminal: on a pipe ovs-ofctl holds its output
    back. Polling `ovs-ofctl dump-flows` instead costs the switch a walk of every flow per poll, which at 100,000
    flows is itself most of what it would measure."""

    EVENT = re.compile(r"event=(ADDED|MODIFIED) table=(\d+) cookie=0x[0-9a-f]+ (\S+)")

    def __init__(self, hv: Hypervisor) -> None:
        super().__init__(daemon=True)
        master, slave = pty.openpty()
        self.proc = subprocess.Popen(["ovs-ofctl", "-O", "OpenFlow13", "monitor", "br-int", "watch:!initial"],
                                     stdout=slave, stderr=slave,  # it prints the events on either
                                     env=os.environ | {"OVS_RUNDIR": str(hv.rundir)})
        os.close(slave)
        self.fd = master
        self.events: list[tuple[float, int, set[str]]] = []
        self.cond = threading.Condition()

    def run(self) -> None:
        pending = b""
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                return
            if not data:
                return
            t = now()
            *lines, pending = (pending + data).split(b"\n")
            with self.cond:
                for line in lines:
                    m = self.EVENT.search(line.decode(errors="replace"))
                    if m:
                        self.events.append((t, int(m.group(2)), set(m.group(3).split(","))))
                self.cond.notify_all()

    def mark(self) -> int:
        with self.cond:
            return len(self.events)

    def wait(self, since: int, wanted: list[tuple[int, str]], timeout: float) -> float:
        """When the last of `wanted` ((table, a field=value of its match)) was added, from event `since` on."""
        left = {w: None for w in wanted}
        i = since
        deadline = now() + timeout
        with self.cond:
            while True:
                for t, table, match in self.events[i:]:
                    for w in left:
                        if left[w] is None and w[0] == table and w[1] in match:
                            left[w] = t
                i = len(self.events)
                if all(v is not None for v in left.values()):
                    return max(left.values())
                if now() > deadline:
                    raise TimeoutError(f"flows not seen in {timeout} s: {[w for w, v in left.items() if v is None]} "
                                       f"({len(self.events)} flows seen; monitor exit code {self.proc.poll()})")
                self.cond.wait(0.05)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        os.close(self.fd)


def add_vifs(hv: Hypervisor, vifs: list[tuple[str, str]]) -> None:
    """VIFs (name, iface-id) as OVS internal interfaces, 500 to a transaction (as the OVN anchor makes its VIFs)."""
    for i in range(0, len(vifs), 500):
        args = []
        for name, iface_id in vifs[i:i + 500]:
            args += ["--", "--may-exist", "add-port", "br-int", name, "--", "set", "Interface", name,
                     "type=internal", f"external_ids:iface-id={iface_id}"]
        hv.vsctl("--timeout=600", *args)


class Run:
    def __init__(self, backend: str, ports: int, args: argparse.Namespace, stack: str = "ipv4") -> None:
        self.backend, self.n, self.args, self.stack = backend, ports, args, stack
        self.T = ports // (S * P)
        self.res: dict = {"backend": backend, "ports": ports, "tenants": self.T, "stack": stack}
        self.v6: dict = {"ipv6_cidr": "auto"} if stack == "dual" else {}  # a dual-stack VPC's and subnets' /56, /64

    def log(self, *a: object) -> None:
        print(f"[{self.backend} {self.n} {self.stack}]", *a, flush=True)

    # --- checks -------------------------------------------------------------------------------------------
    def against_computed(self) -> tuple[set[int], set[int], dict[str, int], int]:
        """(computed, on the switch, plugged ports, local ports in the config)."""
        cfg = self.ctl.admin.get("/v1/hosts/hv0/config")
        want, have, ofports = self.hv.against_computed(cfg, self.fabric.base / "agents" / "zones-hv0.json")
        return want, have, ofports, len(cfg["ports"])

    def check(self, phase: str) -> None:
        """The switch holds exactly the flows computed from scratch; every local port is programmed."""
        deadline = now() + 60
        while True:
            want, have, ofports, local = self.against_computed()
            if have == want or now() > deadline:
                break
            time.sleep(0.5)
        missing, extra = want - have, have - want
        unplugged = local - len(ofports)
        ok = not missing and not extra and not unplugged
        self.res.setdefault("checks", {})[phase] = {"ok": ok, "flows": len(have), "missing": len(missing),
                                                    "extra": len(extra), "unplugged": unplugged, "local": local}
        self.log(f"check after {phase}: {'OK' if ok else 'FAILED'}: switch {len(have)} flows, computed "
                 f"{len(want)}, missing {len(missing)}, extra {len(extra)}, local ports unplugged {unplugged}")

    # --- phases -------------------------------------------------------------------------------------------
    def load(self) -> list:
        """Tenants, VPCs, subnets, ports (bulk per subnet) and peerings; returns [(tenant client, vpc, subnets)]."""

        def tenant(t: int) -> tuple:
            c = self.ctl.tenant(f"t{t}")
            net = tenant_net(t)
            vpc = c.post("/v1/vpcs", {"name": f"vpc{t}", "cidr": str(net)} | self.v6)
            placer = self.ctl.orchestrator()  # one client (and connection) per tenant, as the tenant's own
            subnets = []
            for s in range(S):
                sn_cidr = ipaddress.ip_network((int(net.network_address) + s * 256, 24))
                sn = c.post("/v1/subnets", {"vpc_id": vpc["id"], "name": f"s{s}", "cidr": str(sn_cidr)} | self.v6)
                body = [{"subnet_id": sn["id"], "name": f"t{t}s{s}p{p}",
                         "host": "hv0" if p % BIND_EVERY == 0 else f"h{(t * S * P + s * P + p) % OTHER_HOSTS:02d}"}
                        for p in range(P)]
                subnets.append((sn, placer.post("/v1/ports/bulk", {"ports": body})))
            return c, vpc, subnets

        with ThreadPoolExecutor(8) as ex:
            tenants = list(ex.map(tenant, range(self.T)))

        def peer(t: int) -> None:
            (a, va, _), (b, vb, _) = tenants[t], tenants[t + 1]
            pc = a.post("/v1/peerings", {"requester_vpc_id": va["id"], "accepter_vpc_id": vb["id"]})
            b.post(f"/v1/peerings/{pc['id']}/accept", {})

        with ThreadPoolExecutor(8) as ex:
            list(ex.map(peer, range(self.T - 1)))
        return tenants

    def plug(self, ports: list[dict]) -> None:
        add_vifs(self.hv, [("v" + p["id"].replace("-", "")[:13], p["id"]) for p in ports])

    def bulk(self) -> list:
        t0 = now()
        tenants = self.load()
        t_api = now()
        local = [p for _, _, sns in tenants for _, ports in sns for p in ports if p["host"] == "hv0"]
        self.plug(local)
        t_plug = now()
        self.log(f"API load {t_api - t0:.1f} s ({self.n} ports, {self.T - 1} peerings), {len(local)} VIFs "
                 f"plugged in {t_plug - t_api:.1f} s; waiting for the switch ...")
        want = None
        deadline = t0 + self.args.bulk_timeout
        while now() < deadline:
            if want is None or now() - t_plug < 30:  # until every VIF has its ofport, recompute
                try:
                    want_set, _, ofports, n_local = self.against_computed()
                    if len(ofports) >= len(local) and n_local == len(local):
                        want = len(want_set)
                except (OSError, ValueError):
                    pass
            out = self.hv.ofctl("dump-aggregate", "br-int")
            m = re.search(r"flow_count=(\d+)", out)
            if want is not None and m and int(m.group(1)) == want:
                break
            time.sleep(0.2)
        t_end = now()
        self.res["a_bulk_s"] = round(t_end - t0, 2)
        self.res["a_parts"] = {"api_s": round(t_api - t0, 2), "plug_s": round(t_plug - t_api, 2),
                               "switch_after_plug_s": round(t_end - t_plug, 2)}
        self.res["local_ports"] = len(local)
        self.log(f"(a) bulk -> every flow on hv0: {t_end - t0:.1f} s (API {t_api - t0:.1f}, plug "
                 f"{t_plug - t_api:.1f}, then {t_end - t_plug:.1f})")
        return tenants

    def incremental(self, tenants: list) -> None:
        watch = FlowWatch(self.hv)
        watch.start()
        time.sleep(0.5)
        b, c, d, vsctl, api = [], [], [], [], []
        placer = self.ctl.orchestrator()  # binds ports to hosts, as Nova would
        try:
            for r in range(self.args.reps):
                client, vpc, subnets = tenants[(r * 7919) % len(tenants)]
                sn = subnets[r % S][0]
                # (b) a port created on hv0 -> its ARP flow
                mark, t0 = watch.mark(), now()
                p = placer.post("/v1/ports", {"subnet_id": sn["id"], "name": f"b{r}", "host": "hv0"})
                b.append(watch.wait(mark, [(20, f"arp_tpa={p['ip']}")], 30) - t0)
                # (d) its VIF plugged -> classification, port security and delivery flows
                time.sleep(0.05)
                mark, t0 = watch.mark(), now()
                self.plug([p])
                vsctl.append(now() - t0)
                of = int(self.hv.vsctl("get", "Interface", "v" + p["id"].replace("-", "")[:13], "ofport"))
                d.append(watch.wait(mark, [(0, f"in_port={of}"), (10, f"nw_src={p['ip']}"),
                                           (50, f"nw_dst={p['ip']}")], 30) - t0)
                # (c) a port created on another host in the same VPC -> hv0's flow towards it
                time.sleep(0.05)
                mark, t0 = watch.mark(), now()
                q = placer.post("/v1/ports", {"subnet_id": sn["id"], "name": f"c{r}",
                                              "host": f"h{r % OTHER_HOSTS:02d}"})
                api.append(now() - t0)
                c.append(watch.wait(mark, [(50, f"nw_dst={q['ip']}")], 30) - t0)
                time.sleep(0.05)
        finally:
            watch.stop()
        for key, xs in (("b_port_on_hv", b), ("c_port_elsewhere", c), ("d_vif_plug", d)):
            xs_ms = sorted(x * 1000 for x in xs)
            self.res[key] = {"p50_ms": round(statistics.median(xs_ms), 1), "max_ms": round(xs_ms[-1], 1),
                             "n": len(xs_ms)}
            self.log(f"({key[0]}) {key[2:]}: p50 {statistics.median(xs_ms):.1f} ms, max {xs_ms[-1]:.1f} ms "
                     f"over {len(xs_ms)}")
        self.res["d_vif_plug"]["of_which_vsctl_p50_ms"] = round(statistics.median(vsctl) * 1000, 1)
        self.log(f"    of (d): ovs-vsctl add-port itself (until ovs-vswitchd made the interface) p50 "
                 f"{statistics.median(vsctl) * 1000:.1f} ms")
        self.res["c_port_elsewhere"]["of_which_api_p50_ms"] = round(statistics.median(api) * 1000, 1)
        self.log(f"    of (c): the API call itself (until the controller answered) p50 "
                 f"{statistics.median(api) * 1000:.1f} ms")

    def ovs_floor(self) -> None:
        """The baseline of (d): `ovs-vsctl add-port` on a bare Open vSwitch (its own, no agent, no flows) holding
        as many internal interfaces as hv0: what plugging a VIF costs before any controller is involved."""
        n = self.res["local_ports"] + self.args.reps  # hv0 holds its bulk VIFs and one per repetition
        bare = self.fabric.add_hypervisor("floor")
        bare.vsctl("--may-exist", "add-br", "br-int", "--", "set", "bridge", "br-int", "datapath_type=netdev")
        add_vifs(bare, [(f"f{j:012d}", f"floor-{j}") for j in range(n)])
        xs = []
        for k in range(min(self.args.reps, 10)):  # the same command as `plug` times in (d)
            t0 = now()
            add_vifs(bare, [(f"g{k:012d}", f"floor-g{k}")])
            xs.append(now() - t0)
        self.res["d_vif_plug"]["bare_ovs_add_port_p50_ms"] = round(statistics.median(xs) * 1000, 1)
        self.log(f"    (d)'s floor: add-port on a bare OVS with {n} internal interfaces p50 "
                 f"{statistics.median(xs) * 1000:.1f} ms")

    def memory(self) -> None:
        ctl_pids = [self.ctl.proc.pid, *children(self.ctl.proc.pid)]
        vswitchd = int((self.hv.rundir / "ovs-vswitchd.pid").read_text())
        self.res["rss_mb"] = {"controller": round(sum(rss_mb(p) for p in ctl_pids)),
                              "agent": round(rss_mb(self.hv.agent_pid or 0)),
                              "ovs_vswitchd": round(rss_mb(vswitchd))}
        self.log(f"(e) peak RSS: {self.res['rss_mb']}")

    def run(self) -> dict:
        pg = PgDatabase() if self.backend == "postgres" else None
        self.ctl = ControllerProcess(pg.url if pg else None, self.args.workers if pg else 1, listen="0.0.0.0")
        ctx = mp.get_context("spawn")
        stop = ctx.Event()
        self.fabric = Fabric()
        try:
            hosts = [f"h{i:02d}" for i in range(OTHER_HOSTS)]
            for i, h in enumerate(hosts):
                self.ctl.admin.post("/v1/hosts", {"name": h, "vtep_ip": f"172.16.{i // 250}.{i % 250 + 1}"})
            beats = ctx.Process(target=heartbeat_process, args=(self.ctl.url, self.ctl.admin_token, hosts, stop),
                                daemon=True)
            beats.start()
            self.hv = self.fabric.add_hypervisor("hv0")
            self.fabric.start_agent(self.hv, self.ctl.port, self.ctl.admin_token)
            deadline = now() + 30
            while not self.fabric.agent_status(self.hv).get("switch_synced"):
                if now() > deadline:
                    raise RuntimeError("the agent did not start: " + str(self.fabric.agent_status(self.hv)))
                time.sleep(0.2)
            tenants = self.bulk()
            self.check("bulk")
            self.incremental(tenants)
            self.check("incremental")
            self.memory()
            self.ovs_floor()
            st = self.fabric.agent_status(self.hv)
            self.res["agent"] = {k: st.get(k) for k in ("flows", "connects", "audit_sweeps", "audit_repairs",
                                                         "last_error")}
        finally:
            stop.set()
            if self.args.logs:
                self.args.logs.mkdir(parents=True, exist_ok=True)
                run = f"{self.backend}-{self.n}-{self.stack}"  # each stack's run its own logs
                if (agent_log := self.fabric.base / "agent-hv0.log").exists():
                    shutil.copy(agent_log, self.args.logs / f"{run}-agent-hv0.log")
                shutil.copy(self.ctl.state / "log", self.args.logs / f"{run}-controller.log")
            self.fabric.teardown()
            self.ctl.stop()
            if pg:
                pg.drop()
        return self.res


def per_port(r: dict) -> float | None:
    c = r.get("checks", {}).get("incremental") or r.get("checks", {}).get("bulk")
    return round(c["flows"] / c["local"], 1) if c and c.get("local") else None


def dual_vs_ipv4(results: list[dict]) -> None:
    """Dual-stack beside IPv4-only, each size and backend both ran: flows per port, (a) and (b); the goal: within
    1.3x (#48)."""
    pairs = [(r, d) for r in results if r.get("stack", "ipv4") == "ipv4" for d in results
             if d.get("stack") == "dual" and (d["backend"], d["ports"]) == (r["backend"], r["ports"])]
    if not pairs:
        return
    print("\nDual-stack beside IPv4-only (goal: each within 1.3x):\n")
    print("| backend | ports | flows per port IPv4 / dual | ratio | (a) s IPv4 / dual | ratio | "
          "(b) p50 ms IPv4 / dual | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for r, d in pairs:
        def x(a: float | None, b: float | None) -> str:
            return f"x{b / a:.2f}" if a and b else "-"

        b4, b6 = (v.get("b_port_on_hv", {}).get("p50_ms") for v in (r, d))
        print(f"| {r['backend']} | {r['ports']} | {per_port(r)} / {per_port(d)} | {x(per_port(r), per_port(d))} | "
              f"{r.get('a_bulk_s')} / {d.get('a_bulk_s')} | {x(r.get('a_bulk_s'), d.get('a_bulk_s'))} | "
              f"{b4} / {b6} | {x(b4, b6)} |")


def report(results: list[dict]) -> None:
    print("\n## bench/scale.py: OVN anchor workload, one real agent + OVS (userspace datapath), this machine\n")
    print("| backend | ports | stack | (a) bulk s | (b) port on hv p50/max ms | (c) elsewhere p50/max ms | "
          "(d) VIF plug p50/max ms | flows on hv | RSS ctl/agent/vswitchd MB | checks |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        f = r.get("checks", {})
        print(f"| {r['backend']} | {r['ports']} | {r.get('stack', 'ipv4')} | {r.get('a_bulk_s')} | "
              + " | ".join(f"{r[k]['p50_ms']} / {r[k]['max_ms']}" if k in r else "-"
                           for k in ("b_port_on_hv", "c_port_elsewhere", "d_vif_plug"))
              + f" | {f.get('incremental', f.get('bulk', {})).get('flows')} | "
              + "/".join(str(v) for v in r.get("rss_mb", {}).values())
              + f" | {'OK' if all(c['ok'] for c in f.values()) and f else 'FAILED'} |")
    dual_vs_ipv4(results)
    print("\nOVN 23.03 on this machine kind (measured once with OVN's own benchmark, not in "
          "this run), and the ratio OVN / tianji (above 1: tianji faster):\n")
    print("| backend | ports | (a) OVN s | ratio | (b) OVN median s | ratio | (d) OVN s | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        o = OVN.get(r["ports"])
        if not o:
            continue

        def ratio(ovn: float | None, ours: float | None) -> str:
            return f"x{ovn / ours:.1f}" if ovn and ours else "-"

        b = r.get("b_port_on_hv", {}).get("p50_ms")
        d = r.get("d_vif_plug", {}).get("p50_ms")
        print(f"| {r['backend']} | {r['ports']} | {o['a']} | {ratio(o['a'], r.get('a_bulk_s'))} | {o['b']} | "
              f"{ratio(o['b'], b / 1000 if b else None)} | {o['d'] or '-'} | "
              f"{ratio(o['d'], d / 1000 if d else None)} |")
    print("\ntargets: (b),(c),(d) p50 < 100 ms and max < 500 ms at 20,000 ports; (a) < 60 s at 20,000; agent "
          "< 300 MB at 20,000")
    for r in results:
        if r["ports"] != 20000:
            continue
        for k in ("b_port_on_hv", "c_port_elsewhere", "d_vif_plug"):
            if k in r:
                ok = r[k]["p50_ms"] < 100 and r[k]["max_ms"] < 500
                print(f"  {'met    ' if ok else 'NOT MET'} {r['backend']} ({k[0]}) {r[k]['p50_ms']} / "
                      f"{r[k]['max_ms']} ms")
        if "a_bulk_s" in r:
            print(f"  {'met    ' if r['a_bulk_s'] < 60 else 'NOT MET'} {r['backend']} (a) {r['a_bulk_s']} s")
        if "rss_mb" in r:
            ok = r["rss_mb"]["agent"] < 300
            print(f"  {'met    ' if ok else 'NOT MET'} {r['backend']} agent RSS {r['rss_mb']['agent']} MB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="2000,10000,20000")
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2, help="controller worker processes on PostgreSQL")
    ap.add_argument("--bulk-timeout", type=float, default=900)
    ap.add_argument("--stacks", default="ipv4", help="ipv4, dual (dual-stack VPCs and subnets) or both: ipv4,dual")
    ap.add_argument("--json", type=Path, help="write the results here too")
    ap.add_argument("--logs", type=Path, help="keep the agent's and the controller's logs in this directory")
    args = ap.parse_args()
    backends = args.backends.split(",")
    bad = [b for b in backends if b not in ("sqlite", "postgres")]
    if bad:
        ap.error(f"unknown backend(s) {bad}: sqlite or postgres")
    results = []
    for size in (int(x) for x in args.sizes.split(",")):
        for backend in backends:
            for stack in args.stacks.split(","):
                results.append(Run(backend, size, args, stack).run())
            if args.json:
                args.json.write_text(json.dumps(results, indent=1))
    report(results)


if __name__ == "__main__":
    main()
