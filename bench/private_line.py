"""BGP convergence over a private line, end to end, on the emulated cluster: the site's router announces N prefixes
(or withdraws them), and the clock stops when hv1's vSwitch routes every one of them to a private-line instance
(or none): the customer's BGP, the instances' sessions (FRR), their report, the controller's routes, the agent's
flows.

    python bench/private_line.py [--prefixes 100,1000] [--reps 10]

    python bench/private_line.py --wire 5 [--wire-reps 3]     (packets/s both ways, bench/line_wire.py)

Goals (the private-line issue): 1,000 prefixes in every affected vSwitch within 5 s (p99 over 10 runs), withdrawn
as fast; on the native paths at least 2x Open vSwitch's userspace datapath doing the same job, both ways."""

from __future__ import annotations

import argparse
import ipaddress
import json
import re
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tianji.api_client import Client
from topologies.cluster import Cluster
from topologies.cluster_state import State
from topologies.site import Neighbor, SiteRouter

STATE = Path("/run/tianji-bench")
NAME = "tjpl"
NW_DST = re.compile(r"nw_dst=(172\.\d+\.\d+\.\d+/\d+)")


def prefixes(n: int) -> list[str]:
    base = int(ipaddress.IPv4Address("172.16.0.0"))
    return [f"{ipaddress.IPv4Address(base + (i << 8))}/24" for i in range(n)]


def routed(c: Cluster) -> set[str]:
    return set(NW_DST.findall(c.hypervisor("hv1").ofctl("dump-flows", "br-int", "table=40")))


def announce(site: SiteRouter, nets: list[str], withdraw: bool = False) -> None:
    cmds = ["configure terminal", f"router bgp {site.asn}", "address-family ipv4 unicast",
            *((f"no network {p}" if withdraw else f"network {p}") for p in nets)]
    subprocess.run(["vtysh", "-N", site.ns, *(x for cmd in cmds for x in ("-c", cmd))], check=True,
                   capture_output=True, timeout=120)


def wait(cond, timeout: float) -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            return float("inf")
        time.sleep(0.02)
    return time.monotonic() - t0


def timed(act, done, timeout: float = 60) -> float:
    """Seconds from the start of `act` until `done` holds (inf: not within `timeout`)."""
    t0 = time.monotonic()
    act()
    if wait(done, timeout) == float("inf"):
        return float("inf")
    return time.monotonic() - t0


def setup(c: Cluster) -> tuple[SiteRouter, Client, dict]:
    t = c.admin.post("/v1/tenants", {"name": f"b-{uuid.uuid4().hex[:6]}"})
    a = c.client(t["token"])
    c.admin.put(f"/v1/tenants/{t['id']}/quotas", {"ports": -1})
    vpc = a.post("/v1/vpcs", {"name": "prod", "cidr": "10.0.0.0/16"})
    sn = a.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.0.1.0/24"})
    port = a.post("/v1/ports", {"subnet_id": sn["id"], "name": "vm"})
    c.orchestrator.patch(f"/v1/ports/{port['id']}", {"host": "hv1"})  # hv1 holds the VPC's routes
    line = a.post("/v1/private-lines", {
        "name": "dc1", "vpc_id": vpc["id"], "vlan_id": 100, "customer_asn": 65010, "max_prefixes": 2000,
        "customer_ip": "169.254.100.2/30", "local_ip": "169.254.100.1/30",
        "secondary": {"customer_ip": "169.254.101.2/30", "local_ip": "169.254.101.1/30"}})
    site = SiteRouter(c.state, "site1").start()
    site.add_vlan(100, "169.254.100.2/30")
    subprocess.run(["ip", "-n", site.ns, "addr", "replace", "169.254.101.2/30", "dev", "v100"], check=True)
    site.bgp([Neighbor("169.254.100.1", 64512), Neighbor("169.254.101.1", 64512)])
    up = wait(lambda: sum(s["bgp_state"] == "Established"
                          for s in a.get(f"/v1/private-lines/{line['id']}")["sessions"]) == 2, 60)
    print(f"both sessions established in {up:.1f} s", flush=True)
    return site, a, line


def measure(c: Cluster, site: SiteRouter, n: int, reps: int) -> dict:
    nets = set(prefixes(n))
    learn, withdraw = [], []
    for rep in range(reps):
        learn.append(timed(lambda: announce(site, sorted(nets)), lambda: routed(c) >= nets))
        withdraw.append(timed(lambda: announce(site, sorted(nets), withdraw=True), lambda: not routed(c) & nets))
        print(f"[{n} prefixes] run {rep + 1}: learned -> vSwitch {learn[-1]:.2f} s, withdrawn -> gone "
              f"{withdraw[-1]:.2f} s", flush=True)
    return {"prefixes": n, "learn_p50_s": round(statistics.median(learn), 2), "learn_max_s": round(max(learn), 2),
            "withdraw_p50_s": round(statistics.median(withdraw), 2), "withdraw_max_s": round(max(withdraw), 2),
            "runs": reps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefixes", default="100,1000")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--wire", type=float, default=0, help="seconds per measurement: packets/s, not BGP")
    ap.add_argument("--wire-reps", type=int, default=3)
    ap.add_argument("--sender-napi", action="store_true",
                    help="also measure OVS and tianji with their receive work in the generator's context")
    args = ap.parse_args()
    if args.wire:
        return wire(args.wire, args.wire_reps, args.json, args.sender_napi)
    if (STATE / NAME / "state.json").exists():
        Cluster(State.load(STATE / NAME)).down()
    c = Cluster.up("small", name=NAME, state_dir=STATE, progress=lambda m: print(f"> {m}", flush=True))
    try:
        site, _, _ = setup(c)
        results = [measure(c, site, int(n), args.reps) for n in args.prefixes.split(",")]
        print("\n| prefixes | announced -> in hv1's flows p50 / max | withdrawn -> gone p50 / max | runs |")
        print("|---|---|---|---|")
        for r in results:
            print(f"| {r['prefixes']} | {r['learn_p50_s']} / {r['learn_max_s']} s | {r['withdraw_p50_s']} / "
                  f"{r['withdraw_max_s']} s | {r['runs']} |")
        print("goal: 1,000 prefixes within 5 s (p99 over 10 runs), withdrawn as fast")
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
    finally:
        c.down()


WIRE = {  # what is measured, in each run, interleaved: the machine's drift hits all alike
    "ovs": {"kind": "ovs"},                                 # AF_XDP ports in native mode, its best here
    "tianji": {"kind": "tianji"},                           # what `auto` picks: xdp, with the flow cache
    "tianji dpdk": {"kind": "tianji", "fastpath": "dpdk"},  # every frame through the loop
}
SENDER_NAPI = {  # the same two with the gateway's receive work in the generator's context (a veth's default)
    "ovs, receive on the sender": {"kind": "ovs", "napi": False},
    "tianji, receive on the sender": {"kind": "tianji", "napi": False},
}


def wire(seconds: float, reps: int, out: Path | None, sender_napi: bool) -> None:
    from bench.line_wire import run

    what = WIRE | (SENDER_NAPI if sender_napi else {})
    rows: dict[str, list[dict]] = {k: [] for k in what}
    for rep in range(reps):
        for name, how in what.items():
            r = run(how["kind"], seconds, fastpath=how.get("fastpath", "auto"), napi=how.get("napi", True))
            rows[name].append(r)
            ways = (("out", "VXLAN -> VLAN"), ("in", "VLAN -> VXLAN"))
            print(f"run {rep + 1} {name} ({r['path']}): " + ", ".join(
                f"{label} {r[d] / 1e3:.0f}k pps (offered {r[d + '_offered'] / 1e3:.0f}k, gateway core "
                f"{r[d + '_core']:.0%}, {r[d + '_core_user']:.0%} in user space)" for d, label in ways)
                  + f" {r.get('stage', '')}", flush=True)
    med = {k: {m: statistics.median(x[m] for x in v) for m in ("out", "in", "out_core", "in_core", "out_capacity",
                                                                 "in_capacity")} for k, v in rows.items()}
    print("\n| 64-byte frames, medians | VXLAN -> VLAN carried | gateway core | VLAN -> VXLAN carried | gateway core |")
    print("|---|---|---|---|---|")
    for k in rows:
        print(f"| {k} ({rows[k][0]['path']}) | {med[k]['out'] / 1e3:.0f}k pps | {med[k]['out_core']:.0%} | "
              f"{med[k]['in'] / 1e3:.0f}k pps | {med[k]['in_core']:.0%} |")
    pairs = [("tianji", "ovs")] + ([("tianji, receive on the sender", "ovs, receive on the sender")] if sender_napi
                                   else [])
    for mine, base in pairs:
        for m, label in (("", "carried"), ("_capacity", "per second of the gateway core")):
            x = {d: med[mine][d + m] / max(med[base][d + m], 1) for d in ("out", "in")}
            print(f"| {mine} against {base}, {label} | x{x['out']:.2f} | | x{x['in']:.2f} | |")
    print("goal: at least x2 both ways")
    if out:
        out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
