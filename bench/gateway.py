"""NAT gateway benchmark, every row in one run on the same traffic.

Engine rows: the translation alone (Python reference vs C) on 64-byte UDP packets over 1,000 flows, and the rate
of new mappings. Wire rows (topologies/gwlab.py): a hypervisor stand-in sends the same pre-built VXLAN frames
(64-byte inner UDP, 1,000 flows) as fast as AF_PACKET allows at (a) the Linux kernel decapsulating and SNATing
with nftables, the baseline, and (b) a tianji gateway instance with each fast path; the server counts only the
packets that arrive translated (source = the EIP). Then a TCP client opens and closes connections through each for
the same time: new connections/s.

    python bench/gateway.py [--seconds 3] [--paths dpdk,xdp,packet,python] [--cluster]
    python bench/gateway.py --scale 100,1000 [--backend postgres|sqlite]   (bench/gateway_scale.py)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scapy.layers.inet import IP, UDP

from bench.native_tools import compiled
from nfv_gateways.roles.nat.native import FastNat
from nfv_gateways.roles.nat.policy import NatConfig, SnatRule
from nfv_gateways.roles.nat.reference import NatTable, ip2int
from topologies.gwlab import GatewayLab
from topologies.netns import sh

CFG = NatConfig.of(snat=(SnatRule(1001, "10.0.0.0/8", (ip2int("203.0.113.1"),)),))


def packets(flows: int) -> list[bytes]:
    return [bytes(IP(src=f"10.0.{i // 250}.{i % 250 + 1}", dst="198.51.100.1") / UDP(sport=10000 + i, dport=9)
                  / (b"\0" * 18)) for i in range(flows)]  # 18 bytes of payload: a 64-byte Ethernet frame


def engine_pps(table, pkts: list[bytes], seconds: float) -> float:
    for p in pkts:  # create the mappings first: this measures established flows
        table.outbound(1001, bytearray(p), 0.0)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for p in pkts:
            table.outbound(1001, bytearray(p), 1.0)
        n += len(pkts)
    return n / (time.perf_counter() - t0)


def new_flow_rate(make, count: int = 20000) -> float:
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


CLIENTS = 4  # parallel connecting processes: a rate, not one connection's latency

SERVER_PROG = """
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 7001)); s.listen(4096)
while True:
    c, _ = s.accept(); c.close()
"""
CLIENT_PROG = """
import socket, sys, time
n, end = 0, time.time() + float(sys.argv[1])
while time.time() < end:
    c = socket.socket(); c.settimeout(2)
    try:
        c.connect((sys.argv[2], 7001)); n += 1
    except OSError:
        pass
    c.close()
print(n)
"""


def blaster() -> Path:
    return compiled("blast")


def link_mac(ns: str, dev: str) -> str:
    return json.loads(sh("ip", "-n", ns, "-j", "link", "show", "dev", dev).stdout)[0]["address"]


def vxlan_frames(lab: GatewayLab, flows: int) -> Path:
    """What a hypervisor sends: VXLAN (VNI 1001) to the gateway's VTEP, 64-byte inner UDP frames, `flows` flows."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    from topologies import gwlab

    outer = Ether(src=link_mac(lab.client, "ul0"), dst=link_mac(lab.gw, "ul0")) / IP(src=gwlab.CLIENT_VTEP,
                                                                                     dst=gwlab.GW_VTEP)
    out = bytearray()
    for i in range(flows):
        inner = (Ether(src=gwlab.VM_MAC, dst=gwlab.ROUTER_MAC) / IP(src=gwlab.VM_IP, dst=gwlab.SERVER_IP)
                 / UDP(sport=10000 + i, dport=9) / (b"\0" * 18))
        vxlan = b"\x08\0\0\0" + gwlab.VNI.to_bytes(3, "big") + b"\0"  # RFC 7348 (scapy's default is VXLAN-GPE)
        f = bytes(outer / UDP(sport=49152 + i % 16384, dport=4789) / (vxlan + bytes(inner)))
        out += len(f).to_bytes(2, "big") + f
    path = lab.dir / "frames.bin"
    path.write_bytes(bytes(out))
    return path


def count_translated(lab: GatewayLab) -> int:
    r = sh("ip", "netns", "exec", lab.server, "nft", "list", "chain", "netdev", "bench", "in")
    return int(r.stdout.split("counter packets ")[1].split()[0])


def wire(kind: str, fastpath: str, seconds: float, flows: int = 1000) -> tuple[float, float, float, str]:
    """(translated packets/s received at the server, offered packets/s, new TCP connections/s, fast path)."""
    from topologies import gwlab

    lab = GatewayLab("tjgb")
    try:
        lab.up(kind, fastpath)
        used = "Linux kernel" if kind == "kernel" else lab.status()["fastpath"].split()[0]
        # the server counts (and drops) only what arrives translated: source = the EIP
        for c in ("add table netdev bench", "add chain netdev bench in { type filter hook ingress device eth0 "
                  "priority 0 ; }", f"add rule netdev bench in ip saddr {gwlab.EIP} udp dport 9 counter drop"):
            sh("ip", "netns", "exec", lab.server, "nft", c)
        frames = vxlan_frames(lab, flows)
        # the sender on the first core; the kernel's RPS and the gateway's loop get the other
        pin = ["taskset", "-c", str(min(os.sched_getaffinity(0)))]
        blast = str(blaster())
        sh("ip", "netns", "exec", lab.client, *pin, blast, "ul0", "0.3", str(frames))  # create mappings
        time.sleep(1.5)
        before = count_translated(lab)
        out = sh("ip", "netns", "exec", lab.client, *pin, blast, "ul0", str(seconds), str(frames)).stdout.split()
        time.sleep(0.3)
        got = count_translated(lab) - before
        sent, elapsed = int(out[0]), float(out[1])
        srv = subprocess.Popen(["ip", "netns", "exec", lab.server, sys.executable, "-c", SERVER_PROG],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            clients = [subprocess.Popen(["ip", "netns", "exec", lab.client, sys.executable, "-c", CLIENT_PROG,
                                         str(seconds), gwlab.SERVER_IP], stdout=subprocess.PIPE, text=True)
                       for _ in range(CLIENTS)]
            n = sum(int(p.communicate()[0].strip() or 0) for p in clients)
        finally:
            srv.kill()
            srv.wait()
        return got / elapsed, sent / elapsed, n / seconds, used
    finally:
        lab.down()


def gateway_on_the_cluster(seconds: int) -> float:
    """A VM on the small cluster through the NAT gateway instance to the external host (OVS userspace in front)."""
    from topologies.cluster import Cluster

    c = Cluster.up("small", name="bg", progress=lambda m: None)
    try:
        vm, _eip = nat_vm(c, "bench", "vm")
        c.wait_converged()
        time.sleep(2.5)
        inet = c.state.nodes["inet"]
        c.vm_exec("vm", "ping", "-c", "3", "-W", "1", inet["ip"])
        return iperf_udp(vm["ns"], inet["ns"], inet["ip"], seconds)
    finally:
        c.down()


def nat_vm(c, tenant: str, name: str) -> tuple[dict, str]:
    """A tenant whose VPC leaves through a NAT gateway (a new EIP, SNAT for its subnet, the default route), and a
    VM `name` on hv1 in it: (the VM, the EIP's address)."""
    t = c.admin.post("/v1/tenants", {"name": tenant})
    tc = c.client(t["token"])
    vpc = tc.post("/v1/vpcs", {"name": "v", "cidr": "10.0.0.0/16"})
    sn = tc.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.0.1.0/24"})
    eip = tc.post("/v1/eips", {})
    gw = tc.post("/v1/nat-gateways", {"vpc_id": vpc["id"], "eip_ids": [eip["id"]]})
    tc.post(f"/v1/nat-gateways/{gw['id']}/snat-rules", {"subnet_id": sn["id"], "eip_ids": [eip["id"]]})
    tc.post(f"/v1/vpcs/{vpc['id']}/routes", {"destination": "0.0.0.0/0", "target": f"nat-gateway:{gw['id']}"})
    p = c.orchestrator.post("/v1/ports", {"subnet_id": sn["id"], "name": "vm", "host": "hv1"})
    return c.vm_add(p["id"], name, dhcp=False), eip["address"]


def iperf_udp(client_ns: str, server_ns: str, server_ip: str, seconds: int) -> float:
    """UDP with 18-byte payloads (64-byte frames), 8 parallel streams: received packets/s at the server."""
    srv = subprocess.Popen(["ip", "netns", "exec", server_ns, "iperf3", "-s", "-1", "-p", "5299"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.4)
    cmd = ["ip", "netns", "exec", client_ns, "iperf3", "-c", server_ip, "-p", "5299", "-u", "-b", "0", "-l", "18",
           "-P", "8", "-t", str(seconds), "-J"]
    out = json.loads(sh(*cmd, check=False).stdout or "{}")
    srv.wait(10)
    s = out.get("end", {}).get("sum", {})
    return (s.get("packets", 0) - s.get("lost_packets", 0)) / max(s.get("seconds", seconds), 1e-9)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--skip-wire", action="store_true")
    ap.add_argument("--cluster", action="store_true", help="also measure through the emulated cluster (OVS in front)")
    ap.add_argument("--paths", default="dpdk,xdp,packet,python")
    ap.add_argument("--scale", help="instead: programming at scale with these tenant counts, e.g. 100,1000 "
                    "(bench/gateway_scale.py)")
    ap.add_argument("--backend", default="postgres", choices=("postgres", "sqlite"), help="with --scale")
    ap.add_argument("--reps", type=int, default=20, help="with --scale")
    ap.add_argument("--fastpath", default="auto", help="with --scale")
    args = ap.parse_args()
    if args.scale:
        from bench.gateway_scale import main as scale

        scale([int(x) for x in args.scale.split(",")], args.backend, args.reps, args.fastpath)
        return
    pkts = packets(1000)
    rows: list[tuple[str, float, str]] = []
    figures: dict[str, float] = {}
    py = engine_pps(NatTable(CFG), pkts, args.seconds)
    fast = FastNat(CFG)
    c = engine_pps(fast, pkts, args.seconds)
    fast.close()
    rows.append(("engine, established flows: Python reference", py, "packets/s"))
    rows.append(("engine, established flows: C, one ctypes call per packet", c, "packets/s"))
    rows.append(("engine, new flows: Python reference creates each mapping", new_flow_rate(lambda: NatTable(CFG)),
                 "flows/s"))
    fast = FastNat(CFG, capacity_pow2=1 << 16)
    rows.append(("engine, new flows: C creates each mapping (one ctypes call per packet)",
                 new_flow_rate(lambda: fast), "flows/s"))
    fast.close()
    if not args.skip_wire:
        secs = max(int(args.seconds), 1)
        print(f"wire: VXLAN from a hypervisor stand-in -> gateway -> server, 64-byte UDP over 1,000 flows, {secs} s "
              "per path; then new TCP connections for the same time", file=sys.stderr)
        k_pps, k_off, k_cps, _ = wire("kernel", "", secs)
        figures |= {"wire kernel packets/s": k_pps, "wire kernel conn/s": k_cps}
        rows.append(("wire: Linux kernel VXLAN + nftables SNAT (baseline)", k_pps, f"packets/s "
                     f"(offered {k_off:,.0f}), {k_cps:,.0f} new TCP conn/s"))
        for fp in args.paths.split(","):
            try:
                pps, off, cps, used = wire("tianji", fp, secs)
            except Exception as e:  # a path this machine cannot run is reported, the rest go on
                rows.append((f"wire: tianji --fastpath {fp}", float("nan"), f"unavailable: {str(e)[-200:]}"))
                continue
            figures |= {f"wire {fp} packets/s": pps, f"wire {fp} conn/s": cps,
                        f"wire {fp} packets vs kernel": pps / k_pps, f"wire {fp} conn vs kernel": cps / k_cps}
            rows.append((f"wire: tianji --fastpath {fp} ({used})", pps, f"packets/s (offered {off:,.0f}), "
                         f"{cps:,.0f} new TCP conn/s; x{pps / k_pps:.2f} packets, x{cps / k_cps:.2f} conn vs kernel"))
        if args.cluster:
            rows.append(("cluster: VM -> OVS userspace -> VXLAN -> gateway (auto) -> external host, iperf3",
                         gateway_on_the_cluster(secs), "packets/s"))
    width = max(len(r[0]) for r in rows)
    for name, value, unit in rows:
        print(f"{name:<{width}}  {value:>12,.0f} {unit}")
    print(json.dumps(figures | {name: value for name, value, _ in rows[:4]}))  # for bench/ab.py


if __name__ == "__main__":
    main()
