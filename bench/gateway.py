"""NAT gateway benchmark: the translation engine (Python reference vs the C fast path) on the same 64-byte UDP
packets over 1,000 flows, new-flow rate, and the whole gateway on the wire against the Linux kernel doing the
same SNAT with nftables in namespaces (the baseline), all in one run.

    python bench/gateway.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scapy.layers.inet import IP, UDP  # noqa: E402

from controller.client import Client  # noqa: E402
from nfv_gateways.fastpath import FastNat  # noqa: E402
from nfv_gateways.nat import NatConfig, NatTable, SnatRule, ip2int  # noqa: E402

CFG = NatConfig(snat=(SnatRule(1001, "10.0.0.0/8", (ip2int("203.0.113.1"),)),))


def packets(flows: int) -> list[bytes]:
    return [bytes(IP(src=f"10.0.{i // 250}.{i % 250 + 1}", dst="198.51.100.1") / UDP(sport=10000 + i, dport=9)
                  / (b"\0" * 18)) for i in range(flows)]  # 18 bytes of payload: a 64-byte Ethernet frame


def engine_pps(table, pkts: list[bytes], seconds: float) -> float:  # noqa: ANN001
    for p in pkts:  # create the mappings first: this measures established flows
        table.outbound(1001, bytearray(p), 0.0)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for p in pkts:
            table.outbound(1001, bytearray(p), 1.0)
        n += len(pkts)
    return n / (time.perf_counter() - t0)


def new_flow_rate(make, count: int = 20000) -> float:  # noqa: ANN001
    """Mappings created per second: every packet is a new flow (packets built beforehand, not timed)."""
    base = bytes(IP(src="10.0.0.1", dst="198.51.100.1") / UDP(sport=20000, dport=9) / (b"\0" * 18))
    pkts = []
    for i in range(count):
        p = IP(base)
        p.src = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"
        del p.chksum
        del p[UDP].chksum
        pkts.append(bytes(p))
    table = make()
    t0 = time.perf_counter()
    for p in pkts:
        table.outbound(1001, bytearray(p), 0.0)
    return count / (time.perf_counter() - t0)


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


def iperf_udp(client_ns: str, server_ns: str, server_ip: str, seconds: int, bind: str | None = None) -> float:
    """UDP with 18-byte payloads (64-byte frames), 8 parallel streams: received packets/s at the server."""
    srv = subprocess.Popen(["ip", "netns", "exec", server_ns, "iperf3", "-s", "-1", "-p", "5299"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.4)
    cmd = ["ip", "netns", "exec", client_ns, "iperf3", "-c", server_ip, "-p", "5299", "-u", "-b", "0", "-l", "18",
           "-P", "8", "-t", str(seconds), "-J"] + (["-B", bind] if bind else [])
    out = json.loads(sh(*cmd, check=False).stdout or "{}")
    srv.wait(10)
    s = out.get("end", {}).get("sum", {})
    lost = s.get("lost_packets", 0)
    return (s.get("packets", 0) - lost) / max(s.get("seconds", seconds), 1e-9)


def kernel_baseline(seconds: int) -> float:
    """client ns -> router ns (nftables masquerade) -> server ns, veths with full checksums."""
    names = ("tjgbc", "tjgbr", "tjgbs")
    try:
        for n in names:
            sh("ip", "netns", "add", n)
            sh("ip", "-n", n, "link", "set", "lo", "up")
        sh("ip", "link", "add", "gba", "netns", names[0], "type", "veth", "peer", "name", "gba", "netns", names[1])
        sh("ip", "link", "add", "gbb", "netns", names[1], "type", "veth", "peer", "name", "gbb", "netns", names[2])
        for ns, dev, addr in ((names[0], "gba", "10.0.0.2/24"), (names[1], "gba", "10.0.0.1/24"),
                              (names[1], "gbb", "198.51.100.254/24"), (names[2], "gbb", "198.51.100.1/24")):
            sh("ip", "-n", ns, "addr", "add", addr, "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", names[0], "route", "add", "default", "via", "10.0.0.1")
        sh("ip", "netns", "exec", names[1], "sysctl", "-qw", "net.ipv4.ip_forward=1")
        for rule in ("add table ip nat", "add chain ip nat post { type nat hook postrouting priority 100 ; }",
                     'add rule ip nat post oifname "gbb" masquerade'):
            sh("ip", "netns", "exec", names[1], "nft", rule)
        return iperf_udp(names[0], names[2], "198.51.100.1", seconds)
    finally:
        for n in names:
            sh("ip", "netns", "del", n, check=False)


def gateway_on_the_wire(seconds: int) -> float:
    """A VM on the small cluster through the NAT gateway instance to the external host."""
    from topologies.cluster import Cluster

    c = Cluster.up("small", name="bg", progress=lambda m: None)
    try:
        t = c.admin.post("/v1/tenants", {"name": "bench"})
        tc = Client(c.state.controller_url, t["token"])
        vpc = tc.post("/v1/vpcs", {"name": "v", "cidr": "10.0.0.0/16"})
        sn = tc.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.0.1.0/24"})
        eip = tc.post("/v1/eips", {})
        gw = tc.post("/v1/nat-gateways", {"vpc_id": vpc["id"], "eip_ids": [eip["id"]]})
        tc.post(f"/v1/nat-gateways/{gw['id']}/snat-rules", {"subnet_id": sn["id"], "eip_ids": [eip["id"]]})
        tc.post(f"/v1/vpcs/{vpc['id']}/routes", {"destination": "0.0.0.0/0", "target": f"nat-gateway:{gw['id']}"})
        p = tc.post("/v1/ports", {"subnet_id": sn["id"], "name": "vm", "host": "hv1"})
        vm = c.vm_add(p["id"], "vm", dhcp=False)
        c.wait_converged()
        time.sleep(2.5)
        inet = c.state.nodes["inet"]
        c.vm_exec("vm", "ping", "-c", "3", "-W", "1", inet["ip"])
        return iperf_udp(vm["ns"], inet["ns"], inet["ip"], seconds)
    finally:
        c.down()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--skip-wire", action="store_true")
    args = ap.parse_args()
    pkts = packets(1000)
    rows = []
    py = engine_pps(NatTable(CFG), pkts, args.seconds)
    fast = FastNat(CFG)
    c = engine_pps(fast, pkts, args.seconds)
    fast.close()
    rows.append(("engine, established flows: Python reference", py, "packets/s"))
    rows.append(("engine, established flows: C fast path (one ctypes call per packet)", c, "packets/s"))
    rows.append(("engine, new flows: Python reference creates each mapping", new_flow_rate(lambda: NatTable(CFG)),
                 "flows/s"))
    if not args.skip_wire:
        k = kernel_baseline(int(args.seconds))
        g = gateway_on_the_wire(int(args.seconds))
        rows.append(("wire: Linux kernel SNAT, nftables masquerade (baseline)", k, "packets/s"))
        rows.append(("wire: VM -> OVS -> VXLAN -> tianji NAT gateway (C fast path) -> external", g, "packets/s"))
        rows.append(("wire: gateway path / kernel", g / k if k else float("nan"), "ratio"))
    width = max(len(r[0]) for r in rows)
    for name, value, unit in rows:
        print(f"{name:<{width}}  {value:>12,.2f} {unit}" if unit == "ratio" else
              f"{name:<{width}}  {value:>12,.0f} {unit}")
    print("DPDK and AF_XDP fast paths: not built yet (the wire path uses sockets); the hypervisor's OVS userspace "
          "datapath and the gateway's per-packet socket I/O in Python bound the wire figure, not the C translation.")


if __name__ == "__main__":
    main()
