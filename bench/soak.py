"""A long run: tenants come and go on the emulated cluster while long-lived traffic flows, and every process is
watched for growth.

    python bench/soak.py --minutes 60 [--settle-minutes 10] [--sample-s 30] [--out soak.json]

On the `small` cluster: a steady tenant whose VM on hv1 pings its VM on hv2 every 10 ms, sends them a TCP stream
(iperf3, 2 Mbit/s) for the whole run, and pings the internet host through a NAT gateway every 10 ms. Meanwhile a
churn loop, one tenant at a time, makes and then deletes everything a tenant has: a VPC, a subnet, two ports (one
with a VM plugged, on alternating hypervisors), a security group with rules, an EIP, a NAT gateway with its SNAT
rule and default route, a load balancer (pool, listener, member), a private line whose static prefixes change
twice, and an endpoint of a service the operator publishes. Every API call's failure is counted with its message.

Reported: failures; loss on each long-lived path; whether the TCP stream survived; flows left behind (after the
last delete, each hypervisor's switch against the flows computed from its config, and its flow count against the
count before the churn); resident memory and open files of every process of the cluster over time, and the slope
of each after the first `--settle-minutes` (MiB/h, least squares). Goals (#50): 0 failures, no flow left behind,
no process growing more than 5 MiB/h after its first 10 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gateway import nat_vm

IPERF_PORT = 5301


# --- the processes ---------------------------------------------------------------------------------------------

def processes(cluster_dir: str) -> dict[int, str]:
    """Every process of the cluster (its command line names the cluster's state directory), by a short label."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            argv = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        cmd = [a.decode(errors="replace") for a in argv if a]
        if not cmd or not any(cluster_dir in a for a in cmd):
            continue
        out[int(d)] = label(cmd, cluster_dir)
    return out


def label(cmd: list[str], cluster_dir: str) -> str:
    exe = Path(cmd[0]).name
    line = " ".join(cmd)
    if "ovs-vswitchd" in exe or "ovsdb-server" in exe:
        host = re.search(rf"{re.escape(cluster_dir)}/([^/]+)/", line)
        return f"{exe} {host.group(1) if host else '?'}"
    for kind, flag in (("agent", "--host"), ("gateway", "--name")):
        if kind in cmd and flag in cmd[:-1]:
            return f"{kind} {cmd[cmd.index(flag) + 1]}"
    if "controller" in cmd and "serve" in cmd:
        i = cmd.index("--state-dir") + 1 if "--state-dir" in cmd else 0
        return f"controller {Path(cmd[i]).name}" if i else "controller"
    if "multiprocessing" in line:  # a controller's worker
        return "controller worker"
    return exe + " " + " ".join(cmd[1:3])


def sample(pids: dict[int, str]) -> dict[str, dict]:
    """RSS (MiB) and open files of each labelled process (summed when a label has several)."""
    out: dict[str, dict] = {}
    for pid, name in pids.items():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            fds = len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
        rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024 if "VmRSS" in status else 0.0
        cur = out.setdefault(name, {"rss_mib": 0.0, "fds": 0, "pids": 0})
        cur["rss_mib"] += rss
        cur["fds"] += fds
        cur["pids"] += 1
    return out


def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value) in value per hour."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    den = sum((t - mx) ** 2 for t, _ in points)
    return None if den == 0 else sum((t - mx) * (v - my) for t, v in points) / den * 3600


# --- the churn -------------------------------------------------------------------------------------------------

class Churn:
    def __init__(self, c, service: dict) -> None:
        self.c, self.service = c, service
        self.failures: list[str] = []
        self.rounds = 0
        self.calls = 0

    def call(self, client, method: str, path: str, body: dict | None = None):
        self.calls += 1
        try:
            return client.request(method, path, body) if body is not None else client.request(method, path)
        except Exception as e:
            self.failures.append(f"{method} {path}: {e}"[:300])
            return None

    def round(self, i: int) -> None:
        c = self.c
        made: list[tuple[object, str]] = []  # (client, path) to delete, in reverse
        t = self.call(c.admin, "POST", "/v1/tenants", {"name": f"soak-{i}-{uuid.uuid4().hex[:6]}"})
        if t is None:
            return
        tc = c.client(t["token"])
        vm = None
        try:
            vm = self._build(tc, i, made)
            time.sleep(1.0)  # let it be programmed and served before it goes
            if vm is not None and vm.get("line"):
                for routes in (["192.168.80.0/24", "192.168.81.0/24"], ["192.168.82.0/24"]):
                    self.call(tc, "PATCH", f"/v1/private-lines/{vm['line']}", {"static_routes": routes})
        finally:
            if vm is not None and vm.get("vm") in c.state.vms:
                c.vm_remove(vm["vm"])
            for client, path in reversed(made):
                self.call(client, "DELETE", path)
            self.call(c.admin, "DELETE", f"/v1/tenants/{t['id']}")
        self.rounds += 1

    def _build(self, tc, i: int, made: list) -> dict | None:
        c = self.c
        vpc = self.call(tc, "POST", "/v1/vpcs", {"name": "v", "cidr": "10.1.0.0/16"})
        if vpc is None:
            return None
        made.append((tc, f"/v1/vpcs/{vpc['id']}"))
        sn = self.call(tc, "POST", "/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.1.1.0/24"})
        if sn is None:
            return None
        made.append((tc, f"/v1/subnets/{sn['id']}"))
        sg = self.call(tc, "POST", "/v1/security-groups", {"vpc_id": vpc["id"], "name": "web"})
        if sg is not None:
            made.append((tc, f"/v1/security-groups/{sg['id']}"))
            for port in (80, 443):
                self.call(tc, "POST", f"/v1/security-groups/{sg['id']}/rules",
                          {"direction": "ingress", "protocol": "tcp", "port_range_min": port,
                           "port_range_max": port, "remote_cidr": "0.0.0.0/0"})
        hosts = ("hv1", "hv2", "hv3")
        ports = []
        for k in range(2):
            body = {"subnet_id": sn["id"], "name": f"p{k}", "host": hosts[(i + k) % 3]}
            if sg is not None:
                body["security_group_ids"] = [sg["id"], vpc["default_security_group_id"]]
            p = self.call(c.orchestrator, "POST", "/v1/ports", body)
            if p is not None:
                made.append((tc, f"/v1/ports/{p['id']}"))
                ports.append(p)
        out: dict = {}
        if ports:
            name = f"s{uuid.uuid4().hex[:5]}"
            try:
                c.vm_add(ports[0]["id"], name, dhcp=False, progress=lambda m: None)
                out["vm"] = name
            except Exception as e:
                self.failures.append(f"vm_add: {e}"[:300])
        eip = self.call(tc, "POST", "/v1/eips", {})
        if eip is not None:
            made.append((tc, f"/v1/eips/{eip['id']}"))
            gw = self.call(tc, "POST", "/v1/nat-gateways", {"vpc_id": vpc["id"], "eip_ids": [eip["id"]]})
            if gw is not None:
                made.append((tc, f"/v1/nat-gateways/{gw['id']}"))
                self.call(tc, "POST", f"/v1/nat-gateways/{gw['id']}/snat-rules",
                          {"subnet_id": sn["id"], "eip_ids": [eip["id"]]})
                rt = self.call(tc, "POST", f"/v1/vpcs/{vpc['id']}/routes",
                               {"destination": "0.0.0.0/0", "target": f"nat-gateway:{gw['id']}"})
                if rt is not None:
                    made.append((tc, f"/v1/vpcs/{vpc['id']}/routes/{rt['id']}"))
        lb = self.call(tc, "POST", "/v1/load-balancers", {"name": "lb", "vpc_id": vpc["id"], "subnet_id": sn["id"]})
        if lb is not None:
            made.append((tc, f"/v1/load-balancers/{lb['id']}"))
            pool = self.call(tc, "POST", "/v1/pools", {"load_balancer_id": lb["id"], "name": "p", "protocol": "tcp"})
            if pool is not None:
                self.call(tc, "POST", f"/v1/load-balancers/{lb['id']}/listeners",
                          {"protocol": "tcp", "port": 80, "default_pool_id": pool["id"]})
                for p in ports:
                    self.call(tc, "POST", f"/v1/pools/{pool['id']}/members", {"port_id": p["id"], "protocol_port": 80})
        v = 100 + i % 100
        line = self.call(tc, "POST", "/v1/private-lines", {
            "name": "dc", "vpc_id": vpc["id"], "vlan_id": 1000 + i % 2000, "customer_asn": 65010,
            "customer_ip": f"169.254.{v}.2/30", "local_ip": f"169.254.{v}.1/30", "static_routes": ["192.168.80.0/24"]})
        if line is not None:
            made.append((tc, f"/v1/private-lines/{line['id']}"))
            out["line"] = line["id"]
        ep = self.call(tc, "POST", "/v1/service-endpoints", {"vpc_id": vpc["id"], "subnet_id": sn["id"],
                                                            "service_id": self.service["id"]})
        if ep is not None:
            made.append((tc, f"/v1/service-endpoints/{ep['id']}"))
        return out


# --- the long-lived traffic ------------------------------------------------------------------------------------

class Steady:
    """A tenant whose VMs ping each other and stream TCP for the whole run, and ping the internet through NAT."""

    def __init__(self, c, seconds: int) -> None:
        self.c = c
        t = c.admin.post("/v1/tenants", {"name": "steady"})
        tc = c.client(t["token"])
        vpc = tc.post("/v1/vpcs", {"name": "v", "cidr": "10.9.0.0/16"})
        sn = tc.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.9.1.0/24"})
        tc.post(f"/v1/security-groups/{vpc['default_security_group_id']}/rules",
                {"direction": "ingress", "protocol": "any", "remote_cidr": "10.9.0.0/16"})
        pa = c.orchestrator.post("/v1/ports", {"subnet_id": sn["id"], "name": "a", "host": "hv1"})
        pb = c.orchestrator.post("/v1/ports", {"subnet_id": sn["id"], "name": "b", "host": "hv2"})
        self.a, self.b = c.vm_add(pa["id"], "steady-a", dhcp=False), c.vm_add(pb["id"], "steady-b", dhcp=False)
        self.nat, _eip = nat_vm(c, "steady-nat", "steady-n")
        self.inet = c.state.nodes["inet"]["ip"]
        self.seconds = seconds

    def wait_reachable(self) -> None:
        deadline = time.time() + 60
        for vm, ip in ((self.a, self.b["ip"]), (self.nat, self.inet)):
            while subprocess.run(["ip", "netns", "exec", vm["ns"], "ping", "-c", "1", "-W", "1", ip],
                                 capture_output=True).returncode:
                if time.time() > deadline:
                    raise SystemExit(f"the steady tenant's {vm['name']} does not reach {ip}")

    def start(self) -> None:
        s = str(self.seconds)
        ns = lambda vm: ["ip", "netns", "exec", vm["ns"]]  # noqa: E731
        self.pings = {
            "vm -> vm (10 ms)": subprocess.Popen([*ns(self.a), "ping", "-i", "0.01", "-W", "1", "-w", s, "-q",
                                                  self.b["ip"]], stdout=subprocess.PIPE, text=True),
            "vm -> internet through NAT (10 ms)": subprocess.Popen(
                [*ns(self.nat), "ping", "-i", "0.01", "-W", "1", "-w", s, "-q", self.inet],
                stdout=subprocess.PIPE, text=True)}
        self.server = subprocess.Popen([*ns(self.b), "iperf3", "-s", "-1", "-p", str(IPERF_PORT)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        self.tcp = subprocess.Popen([*ns(self.a), "iperf3", "-c", self.b["ip"], "-p", str(IPERF_PORT), "-b", "2M",
                                     "-t", s, "-i", "60", "-J"], stdout=subprocess.PIPE, text=True)

    def results(self) -> dict:
        out: dict = {}
        for name, p in self.pings.items():
            text, _ = p.communicate(timeout=self.seconds + 120)
            m = re.search(r"(\d+) packets transmitted, (\d+) received", text)
            sent, got = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
            out[name] = {"sent": sent, "received": got, "lost": sent - got}
        text, _ = self.tcp.communicate(timeout=self.seconds + 120)
        self.server.wait(30)
        r = json.loads(text or "{}")
        end = r.get("end", {})
        gaps = [i["sum"]["bytes"] for i in r.get("intervals", [])]
        out["tcp stream (iperf3, 2 Mbit/s)"] = {
            "survived": self.tcp.returncode == 0 and not r.get("error") and all(gaps),
            "error": r.get("error"), "bytes": end.get("sum_received", {}).get("bytes"),
            "retransmits": end.get("sum_sent", {}).get("retransmits"), "empty_intervals": gaps.count(0)}
        return out


# --- the run ---------------------------------------------------------------------------------------------------

def flows_as_computed(c, hv: str) -> tuple[bool, int]:
    cfg = c.admin.get(f"/v1/hosts/{hv}/config")
    want, have, _ = c.hypervisor(hv).against_computed(cfg, Path(c.state.dir) / "agents" / f"zones-{hv}.json")
    return want == have, len(have)


def run(args: argparse.Namespace) -> dict:
    from topologies.cluster import Cluster

    seconds = int(args.minutes * 60)
    c = Cluster.up("small", name=args.name, database_url=args.database_url, controllers=args.controllers,
                   progress=lambda m: None)
    try:
        adm = c.admin
        addr, port = c.service_address("store")
        service = adm.post("/v1/services", {"name": "store", "addresses": [addr],
                                            "ports": [{"protocol": "tcp", "port": port}]})
        steady = Steady(c, seconds)
        c.wait_converged(60)
        steady.wait_reachable()
        hvs = list(c.state.hypervisors)
        before = {hv: flows_as_computed(c, hv)[1] for hv in hvs}
        steady.start()
        churn = Churn(c, service)
        t0 = time.monotonic()
        series: list[dict] = []
        stop = threading.Event()

        def sampler() -> None:
            while not stop.is_set():
                series.append({"t": round(time.monotonic() - t0, 1), "procs": sample(processes(c.state.dir)),
                               "rounds": churn.rounds, "failures": len(churn.failures)})
                stop.wait(args.sample_s)

        th = threading.Thread(target=sampler, daemon=True)
        th.start()
        i = 0
        while time.monotonic() - t0 < seconds - 15:
            churn.round(i)
            i += 1
            if i % 20 == 0:
                print(f"[soak] {time.monotonic() - t0:.0f} s: {churn.rounds} rounds, {churn.calls} calls, "
                      f"{len(churn.failures)} failures", flush=True)
        traffic = steady.results()
        stop.set()
        th.join()
        series.append({"t": round(time.monotonic() - t0, 1), "procs": sample(processes(c.state.dir)),
                       "rounds": churn.rounds, "failures": len(churn.failures)})
        c.wait_converged(60)
        left = {}
        for hv in hvs:
            deadline, ok, n = time.time() + 30, False, 0
            while time.time() < deadline and not ok:
                ok, n = flows_as_computed(c, hv)
                time.sleep(0.5)
            left[hv] = {"as_computed": ok, "flows_before": before[hv], "flows_after": n}
        return {"minutes": args.minutes, "rounds": churn.rounds, "api_calls": churn.calls,
                "failures": churn.failures, "traffic": traffic, "flows": left, "series": series,
                "settle_minutes": args.settle_minutes}
    finally:
        c.down()


def merged(procs: dict[str, dict]) -> dict[str, dict]:
    """A private line's routing daemons (one set per line, named after its namespace) summed per daemon: whether
    they add up over time says whether deleted lines' daemons stop."""
    out: dict[str, dict] = {}
    for name, v in procs.items():
        key = re.sub(r" -N tjl-[0-9a-f]+.*", " (every line's)", name)
        cur = out.setdefault(key, {"rss_mib": 0.0, "fds": 0, "pids": 0})
        for k in cur:
            cur[k] += v[k]
    return out


def growth(result: dict) -> dict[str, dict]:
    """Per process: RSS and fds at the first sample after settling and at the end, and the RSS slope (MiB/h)."""
    settle = result["settle_minutes"] * 60
    series = [(s["t"], merged(s["procs"])) for s in result["series"]]
    names = sorted({n for _, procs in series for n in procs})
    out = {}
    for n in names:
        pts = [(t, procs[n]) for t, procs in series if n in procs]
        late = [(t, v) for t, v in pts if t >= settle] or pts[len(pts) // 2:]
        out[n] = {"rss_first": round(pts[0][1]["rss_mib"], 1), "rss_settled": round(late[0][1]["rss_mib"], 1),
                  "rss_end": round(pts[-1][1]["rss_mib"], 1),
                  "rss_mib_per_h": slope_per_hour([(t, v["rss_mib"]) for t, v in late]),
                  # the slope over the last half of that: whether the growth slows (settles) or keeps on
                  "rss_mib_per_h_late": slope_per_hour([(t, v["rss_mib"]) for t, v in late[len(late) // 2:]]),
                  "fds_settled": late[0][1]["fds"], "fds_end": pts[-1][1]["fds"],
                  "pids_settled": late[0][1]["pids"], "pids_end": pts[-1][1]["pids"]}
    return out


def report(result: dict) -> None:
    print(f"\n## soak: {result['minutes']} min, {result['rounds']} churn rounds, {result['api_calls']} API calls, "
          f"{len(result['failures'])} failures")
    for f in result["failures"][:20]:
        print(f"- failure: {f}")
    print("\n| path | sent | lost |\n|---|---|---|")
    for name, r in result["traffic"].items():
        if "sent" in r:
            print(f"| {name} | {r['sent']} | {r['lost']} |")
    tcp = result["traffic"]["tcp stream (iperf3, 2 Mbit/s)"]
    error = f", {tcp['error']}" if tcp["error"] else ""
    print(f"\nTCP stream: {'survived' if tcp['survived'] else 'BROKE'} ({tcp['bytes']} bytes, "
          f"{tcp['retransmits']} retransmits, {tcp['empty_intervals']} empty minutes{error})")
    print("\n| hypervisor | flows as computed | flows before / after |\n|---|---|---|")
    for hv, r in result["flows"].items():
        print(f"| {hv} | {'yes' if r['as_computed'] else 'NO'} | {r['flows_before']} / {r['flows_after']} |")
    g = growth(result)
    print(f"\n| process | RSS MiB first / after {result['settle_minutes']} min / end | MiB/h after settling (its "
          "last half) "
          "| open files settled / end | processes settled / end |\n|---|---|---|---|---|")
    for n, r in g.items():
        slope = "-" if r["rss_mib_per_h"] is None else f"{r['rss_mib_per_h']:+.1f}"
        if r["rss_mib_per_h_late"] is not None:
            slope += f" ({r['rss_mib_per_h_late']:+.1f})"
        flag = " **over 5**" if r["rss_mib_per_h"] is not None and r["rss_mib_per_h"] > 5 else ""
        print(f"| {n} | {r['rss_first']} / {r['rss_settled']} / {r['rss_end']} | {slope}{flag} | "
              f"{r['fds_settled']} / {r['fds_end']} | {r['pids_settled']} / {r['pids_end']} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--settle-minutes", type=float, default=10, help="growth is measured after this")
    ap.add_argument("--sample-s", type=float, default=30)
    ap.add_argument("--name", default="soak", help="the cluster's name")
    ap.add_argument("--database-url", default=os.environ.get("TIANJI_DATABASE_URL"))
    ap.add_argument("--controllers", type=int, default=None, help="replicas (more than one: give --database-url)")
    ap.add_argument("--out", type=Path, help="write the result (every sample) as JSON")
    args = ap.parse_args()
    result = run(args)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    report(result)


if __name__ == "__main__":
    main()
