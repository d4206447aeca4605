"""Emulated-cluster benchmark (root): bring-up times, overlay throughput/latency against the kernel's own
vxlan device measured in the same run (cross-host TCP at the default VPC MTU and the largest the underlay allows,
1 and 4 streams, with the OVS port types used), and the time for 100 new ports to become reachable.

    python bench/cluster.py [--ports 100] [--skip-medium] [--throughput-only]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.ovs_baseline import FLOWS, on_bare_ovs
from topologies import netns
from topologies.cluster import Cluster
from topologies.netns import sh


def ns(name: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return sh(*cmd, ns=name, check=check)


def tcp_and_rtt(client_ns: str, server_ns: str, server_ip: str, streams: int = 1,
                seconds: float = 3) -> tuple[float, float, int]:
    """(Mbit/s received, ping rtt ms, TCP retransmits) from client to server, `streams` parallel streams."""
    srv = subprocess.Popen(["ip", "netns", "exec", server_ns, "iperf3", "-s", "-1", "-B", server_ip],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.4)
    ns(client_ns, "ping", "-c", "3", "-W", "1", server_ip, check=False)  # warm up
    out = json.loads(ns(client_ns, "iperf3", "-c", server_ip, "-t", str(seconds), "-P", str(streams), "-J").stdout)
    srv.wait(10)
    rtt = ns(client_ns, "ping", "-c", "20", "-i", "0.05", server_ip).stdout
    avg = float(next(ln for ln in rtt.splitlines() if "min/avg" in ln).split("/")[4])
    end = out["end"]
    return end["sum_received"]["bits_per_second"] / 1e6, avg, int(end["sum_sent"].get("retransmits", 0))


def kernel_vxlan_baseline(mtu: int, streams: int) -> tuple[float, float, int]:
    """Two namespaces joined by a veth 'underlay' (MTU + 50), each with a kernel vxlan device at `mtu`."""
    names = ("tjbl1", "tjbl2")
    try:
        for n in names:
            netns.add(n)
        netns.veth("u", names[0], "u", names[1], mtu=mtu + 50)
        for i, n in enumerate(names, start=1):
            netns.address(n, "u", f"192.168.77.{i}/24")
            ns(n, "ip", "link", "add", "vx", "type", "vxlan", "id", "4242", "local", f"192.168.77.{i}", "remote",
               f"192.168.77.{3 - i}", "dstport", "4789")
            ns(n, "ip", "addr", "add", f"10.77.0.{i}/24", "dev", "vx")
            ns(n, "ip", "link", "set", "vx", "mtu", str(mtu), "up")
        return tcp_and_rtt(names[0], names[1], "10.77.0.2", streams)
    finally:
        netns.delete(names)


def measure_throughput(c: Cluster, rows: list) -> None:
    """Cross-host VM-to-VM TCP at the default VPC MTU and the largest the underlay allows, 1 and 4 streams,
    next to the kernel's own VXLAN device at the same MTU, with the OVS port types the VMs got, and next to OVS
    alone on the same ports (bench/ovs_baseline.py: the userspace datapath's ceiling here)."""
    tc = c.client(c.admin.post("/v1/tenants", {"name": "tput"})["token"])
    big = c.state.topology.get("underlay_mtu", 1500) - 50
    tianji: dict[tuple[int, int], float] = {}
    for mtu in sorted({1450, big}):
        vpc = tc.post("/v1/vpcs", {"name": f"m{mtu}", "cidr": "10.9.0.0/16", "mtu": mtu})
        sn = tc.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.9.0.0/24"})
        vms = [c.vm_add(c.orchestrator.post("/v1/ports", {"subnet_id": sn["id"], "name": f"t{h}", "host": h})["id"],
                        f"t{mtu}{h}", dhcp=True) for h in ("hv1", "hv2")]
        types = c.agent_status("hv1").get("port_types", {})
        for streams in (1, 4):
            mbit, rtt, rtx = tcp_and_rtt(vms[0]["ns"], vms[1]["ns"], vms[1]["ip"], streams, seconds=5)
            kmbit, _, _ = kernel_vxlan_baseline(mtu, streams)
            rows.append((f"TCP cross host, VPC MTU {mtu}, {streams} stream(s); ports {types}",
                         f"{mbit / 1000:.2f} Gbit/s", f"x{mbit / kmbit:.2f} of kernel vxlan ({kmbit / 1000:.1f} "
                                                       f"Gbit/s), {rtx} retransmits, rtt {rtt:.3f} ms"))
            tianji[(mtu, streams)] = mbit
        for pipeline in FLOWS:
            bare = on_bare_ovs(mtu, pipeline, lambda c, s, ip: {n: tcp_and_rtt(c, s, ip, n, seconds=5)[0]
                                                                 for n in (1, 4)})
            for streams, mbit in bare.items():
                rows.append((f"  OVS alone ({pipeline}), AF_XDP, MTU {mtu}, {streams} stream(s)",
                             f"{mbit / 1000:.2f} Gbit/s",
                             f"tianji is x{tianji[(mtu, streams)] / mbit:.2f} of it"))


def measure_small(c: Cluster, args: argparse.Namespace, rows: list) -> None:
        adm = c.admin
        t = adm.post("/v1/tenants", {"name": "bench"})
        tc = c.client(t["token"])
        vpc = tc.post("/v1/vpcs", {"name": "v", "cidr": "10.0.0.0/16"})
        sn = tc.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.0.0.0/20"})

        def vm(host: str, name: str) -> dict:
            p = c.orchestrator.post("/v1/ports", {"subnet_id": sn["id"], "name": name, "host": host})
            return c.vm_add(p["id"], name, dhcp=False)

        a, b_same, b_cross = vm("hv1", "a"), vm("hv1", "same"), vm("hv2", "cross")
        same = tcp_and_rtt(a["ns"], b_same["ns"], b_same["ip"])
        cross = tcp_and_rtt(a["ns"], b_cross["ns"], b_cross["ip"])
        base = kernel_vxlan_baseline(1450, 1)
        rows.append(("TCP, same host (OVS userspace)", f"{same[0]:.0f} Mbit/s", f"rtt {same[1]:.3f} ms"))
        rows.append(("TCP, cross host over VXLAN (OVS userspace)", f"{cross[0]:.0f} Mbit/s",
                     f"rtt {cross[1]:.3f} ms"))
        rows.append(("TCP, kernel vxlan device, same kind of namespaces (baseline)", f"{base[0]:.0f} Mbit/s",
                     f"rtt {base[1]:.3f} ms"))
        rows.append(("cross host / kernel baseline", f"x{cross[0] / base[0]:.2f} throughput",
                     f"x{cross[1] / base[1]:.2f} rtt"))
        # 100 new ports across the cluster: API create -> plugged -> reachable from VM a
        t0 = time.monotonic()
        hosts = list(c.state.hypervisors)

        def new_port(i: int) -> str:
            p = c.orchestrator.post("/v1/ports", {"subnet_id": sn["id"], "name": f"n{i}",
                                                  "host": hosts[i % len(hosts)]})
            c.vm_add(p["id"], f"n{i}", dhcp=False)
            return p["ip"]

        with ThreadPoolExecutor(4) as ex:  # the hypervisors plug VMs in parallel, as Nova computes do
            ips = list(ex.map(new_port, range(args.ports)))
        pending = set(ips)
        while pending:
            for ip in list(pending):
                if ns(a["ns"], "ping", "-c", "1", "-W", "0.2", ip, check=False).returncode == 0:
                    pending.discard(ip)
            if time.monotonic() - t0 > 300:
                break
        rows.append((f"{args.ports} new ports across {len(hosts)} hypervisors: create, plug, all reachable",
                     f"{time.monotonic() - t0:.1f} s", f"unreachable: {len(pending)}"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ports", type=int, default=100)
    ap.add_argument("--skip-medium", action="store_true")
    ap.add_argument("--throughput-only", action="store_true", help="only the overlay throughput rows (small)")
    args = ap.parse_args()
    rows = []
    for topo in ("small",) + (() if args.skip_medium or args.throughput_only else ("medium",)):
        c = Cluster.up(topo, name=f"b{topo[0]}", progress=lambda m: None)
        rows.append((f"bring-up of {topo} ({len(c.state.hypervisors)} hypervisors, agents reporting)",
                     f"{c.state.up_seconds:.2f} s", ""))
        if topo != "small":
            c.down()
            continue
        try:
            measure_throughput(c, rows)
            if not args.throughput_only:
                measure_small(c, args, rows)
        finally:
            c.down()
    width = max(len(r[0]) for r in rows)
    for r in rows:
        print(f"{r[0]:<{width}}  {r[1]:>18}  {r[2]}")


if __name__ == "__main__":
    main()
