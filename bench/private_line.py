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

from tianjictl.client import Client
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
    args = ap.parse_args()
    if args.wire:
        return wire(args.wire, args.wire_reps, args.json)
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


def busy_of(r: dict) -> str:
    return " ".join(f"{d}: loop busy {r[d + '_busy']:.0%}" for d in ("out", "in") if f"{d}_busy" in r)


def wire(seconds: float, reps: int, out: Path | None) -> None:
    from bench.line_wire import run

    rows: dict[str, list[dict]] = {"ovs": [], "tianji": []}
    for rep in range(reps):  # interleaved: the machine's drift hits both alike
        for kind in rows:
            rows[kind].append(run(kind, seconds))
            r = rows[kind][-1]
            print(f"run {rep + 1} {kind} ({r['path']}): VXLAN -> VLAN {r['out'] / 1e3:.0f}k pps (offered "
                  f"{r['out_offered'] / 1e3:.0f}k), VLAN -> VXLAN {r['in'] / 1e3:.0f}k pps (offered "
                  f"{r['in_offered'] / 1e3:.0f}k) {r.get('stage', '')} {busy_of(r)}", flush=True)
    med = {k: {d: statistics.median(x[d] for x in v) for d in ("out", "in")} for k, v in rows.items()}
    print("\n| 64-byte frames, median of runs | VXLAN -> VLAN | VLAN -> VXLAN |\n|---|---|---|")
    for k in rows:
        print(f"| {k} ({rows[k][0]['path']}) | {med[k]['out'] / 1e3:.0f}k pps | {med[k]['in'] / 1e3:.0f}k pps |")
    print(f"| ratio | x{med['tianji']['out'] / max(med['ovs']['out'], 1):.2f} | "
          f"x{med['tianji']['in'] / max(med['ovs']['in'], 1):.2f} |")
    t = rows["tianji"]
    if all(f"{d}_capacity" in x for x in t for d in ("out", "in")):  # OVS dropped what it could not carry
        cap = {d: statistics.median(x[f"{d}_capacity"] for x in t) for d in ("out", "in")}
        busy = {d: statistics.median(x[f"{d}_busy"] for x in t) for d in ("out", "in")}
        print(f"| tianji's loop busy | {busy['out']:.0%} | {busy['in']:.0%} |")
        print(f"| tianji's capacity (carried / busy time) | {cap['out'] / 1e3:.0f}k pps | {cap['in'] / 1e3:.0f}k pps |")
        print(f"| capacity against OVS's saturated rate | x{cap['out'] / max(med['ovs']['out'], 1):.2f} | "
              f"x{cap['in'] / max(med['ovs']['in'], 1):.2f} |")
    print("goal: at least x2 both ways")
    if out:
        out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
