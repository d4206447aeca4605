"""Controller replicas on the emulated cluster: two controllers on PostgreSQL, TLS, every host given both URLs.

(1) Cross-replica latency: a port created through the replica the hypervisors watch, and through the other one
    (whose write reaches the watchers through PostgreSQL's NOTIFY), until its flow is on its hypervisor (an
    OpenFlow monitor's event): p50/p99 of each, and their ratio (the baseline is the same run's same-replica write).
(2) The kill-a-replica drill (tests/support/replicas.py), `--rounds` times: kill -9 the leader, which every host
    watches, under a 10 ms ping between hypervisors and through the NAT gateway while a tenant writes through the
    other replica: how long until every host watches the survivor, until it leads, until it runs the liveness
    checks, and a port created through it during the outage is plugged and programmed.

    python bench/replicas.py [--reps 40] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.scale import FlowWatch, now
from tests.support.controller import PgDatabase
from tests.support.replicas import kill_round
from topologies.cluster import DEFAULT_STATE, Cluster
from topologies.cluster_state import State

NAME = "brp"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))] * 1000, 1)


def cross_replica(c: Cluster, token: str, subnet_id: str, reps: int) -> dict:
    lead = c.leader()
    assert lead is not None and set(c.watching().values()) == {lead}
    other = 1 - lead
    via = {"watched": c.replica(lead, token), "other": c.replica(other, token)}
    orch = {k: c.replica(i, c.state.orchestrator_token) for k, i in (("watched", lead), ("other", other))}
    watch = FlowWatch(c.hypervisor("hv2"))
    watch.start()
    time.sleep(0.5)
    got: dict[str, list[float]] = {"watched": [], "other": []}
    made = []
    for r in range(reps):
        k = "watched" if r % 2 == 0 else "other"
        mark, t0 = watch.mark(), now()
        p = orch[k].post("/v1/ports", {"subnet_id": subnet_id, "name": f"x{r}", "host": "hv2"})
        got[k].append(watch.wait(mark, [(20, f"arp_tpa={p['ip']}")], 30) - t0)
        made.append(p["id"])
    for pid in made:
        via["watched"].delete(f"/v1/ports/{pid}")
    out = {k: {"p50_ms": pct(v, 0.5), "p99_ms": pct(v, 0.99), "n": len(v)} for k, v in got.items()}
    out["ratio_p50"] = round(statistics.median(got["other"]) / statistics.median(got["watched"]), 2)
    return out


def setup(c: Cluster) -> tuple[str, str, str, dict]:
    """A tenant with a VPC behind a NAT gateway, VMs on hv1 and hv2: (token, subnet for writes, subnet of the VMs,
    the pings)."""
    t = c.admin.post("/v1/tenants", {"name": "replicas"})
    tc = c.client(t["token"])
    vpc = tc.post("/v1/vpcs", {"name": "prod", "cidr": "10.0.0.0/16"})
    s = tc.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.0.1.0/24"})
    w = tc.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "w", "cidr": "10.0.64.0/18"})
    eip = tc.post("/v1/eips", {})
    gw = tc.post("/v1/nat-gateways", {"vpc_id": vpc["id"], "eip_ids": [eip["id"]]})
    tc.post(f"/v1/nat-gateways/{gw['id']}/snat-rules", {"subnet_id": s["id"], "eip_ids": [eip["id"]]})
    tc.post(f"/v1/vpcs/{vpc['id']}/routes", {"destination": "0.0.0.0/0", "target": f"nat-gateway:{gw['id']}"})
    vms = []
    for h in ("hv1", "hv2"):
        p = tc.post("/v1/ports", {"subnet_id": s["id"], "name": h})
        c.orchestrator.patch(f"/v1/ports/{p['id']}", {"host": h})
        vms.append(c.vm_add(p["id"], f"r{h}", dhcp=False))
    inet = c.state.nodes["inet"]
    for ip in (vms[1]["ip"], inet["ip"]):  # the first packets wait for ARP and the NAT's first mapping
        deadline = time.time() + 15
        while c.vm_exec(vms[0]["name"], "ping", "-c", "1", "-W", "1", ip).returncode != 0:
            assert time.time() < deadline, f"{ip} unreachable"
    pings = {"hv1->hv2": (vms[0]["ns"], vms[1]["ip"]), "hv1->NAT->internet": (vms[0]["ns"], inet["ip"])}
    return t["token"], w["id"], s["id"], pings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if (DEFAULT_STATE / NAME / "state.json").exists():
        Cluster(State.load(DEFAULT_STATE / NAME)).down()
    pg = PgDatabase()
    c = Cluster.up("small", name=NAME, database_url=pg.url, controllers=2, progress=lambda m: print(f"> {m}"))
    try:
        token, writes, vms_subnet, pings = setup(c)
        res = {"cross_replica": cross_replica(c, token, vms_subnet, args.reps), "rounds": []}
        x = res["cross_replica"]
        print(f"(1) port -> flow on its hypervisor: through the watched replica p50 {x['watched']['p50_ms']} ms, "
              f"p99 {x['watched']['p99_ms']} ms; through the other p50 {x['other']['p50_ms']} ms, p99 "
              f"{x['other']['p99_ms']} ms (x{x['ratio_p50']})", flush=True)

        def served() -> dict[str, str]:
            return {e: g for g in ("gw1", "gw2") for e in c.gateway_status(g).get("eips", [])}

        for r in range(args.rounds):
            got = kill_round(c, token, writes, (vms_subnet, "hv3"), pings, f"b{r}", served)
            res["rounds"].append(got.__dict__ | {"hosts_down": sorted(got.hosts_down)})
            print(f"(2) round {r + 1}: killed replica {got.killed}; every host on the survivor {got.watch_moved_s} s,"
                  f" it leads {got.leader_s} s, runs the liveness checks {got.liveness_s} s; port through it -> "
                  f"plugged and programmed {got.port_flows_s} s; pings {got.pings}; writes {got.writes} "
                  f"(lost {got.writes_lost}, refused {len(got.writes_failed)}); hosts down {sorted(got.hosts_down)};"
                  f" EIPs moved {got.eips_moved}; whole configs {got.whole_configs}; back as {got.rejoined_as}",
                  flush=True)
        rounds = res["rounds"]
        for k in ("watch_moved_s", "leader_s", "liveness_s", "port_flows_s"):
            xs = [r[k] for r in rounds]
            res[f"{k}_median"], res[f"{k}_max"] = statistics.median(xs), max(xs)
        print("| | median | max |\n|---|---|---|")
        for k, what in (("watch_moved_s", "every host watching the survivor"), ("leader_s", "the survivor leads"),
                        ("liveness_s", "it runs the liveness checks"),
                        ("port_flows_s", "a port through it, plugged and programmed")):
            print(f"| {what} | {res[k + '_median']} s | {res[k + '_max']} s |")
        print(json.dumps(res, default=str))
    finally:
        c.down()
        pg.drop()


if __name__ == "__main__":
    main()
