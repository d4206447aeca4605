"""Scenarios 1-5 and 9: connectivity, the wire, isolation, spoofing, distributed peering, DHCP."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.layers.vxlan import VXLAN

from tests.scenarios.conftest import Capture, ex, ping, reach, scapy_send, underlay_capture, wait_for
from topologies.machines import own_resolv_conf, resolv_conf


def hv_ns(cluster, host: str) -> str:
    return cluster.state.hypervisors[host]["ns"]


def udp_roundtrip(cluster, client: dict, server: dict, port: int = 7777) -> bool:
    srv = ("import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('%s', %d)); "
           "d, a = s.recvfrom(2048); s.sendto(d[::-1], a)") % (server["ip"], port)
    p = subprocess.Popen(["ip", "netns", "exec", server["ns"], sys.executable, "-c", srv])
    time.sleep(0.4)
    cli = ("import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2); "
           "s.sendto(b'tianji', ('%s', %d)); print(s.recvfrom(2048)[0].decode())") % (server["ip"], port)
    r = ex(cluster, client, sys.executable, "-c", cli)
    p.kill()
    return r.stdout.strip() == "ijnait"


def tcp_transfer(cluster, client: dict, server: dict) -> float:
    """iperf3 for 1 s; returns Mbit/s (TCP is what catches checksum and MTU problems)."""
    srv = subprocess.Popen(["ip", "netns", "exec", server["ns"], "iperf3", "-s", "-1", "-B", server["ip"]],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.4)
        out = ex(cluster, client, "iperf3", "-c", server["ip"], "-t", "1", "-J").stdout
        return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6
    finally:
        srv.kill()


def test_1_connectivity_icmp_tcp_udp(cluster, tenants) -> None:
    a = tenants()
    a.vpc("prod", "10.0.0.0/16", {"web": "10.0.1.0/24", "app": "10.0.2.0/24"})
    w1 = a.vm("web", "hv1")
    w1b = a.vm("web", "hv1")
    w2 = a.vm("web", "hv2")
    ap3 = a.vm("app", "hv3")
    for label, src, dst in (("same subnet, same host", w1, w1b), ("same subnet, cross host", w1, w2),
                            ("cross subnet, cross host", w1, ap3), ("cross subnet, back", ap3, w2)):
        assert reach(cluster, src, dst["ip"]), label
        assert udp_roundtrip(cluster, src, dst), f"UDP {label}"
        assert tcp_transfer(cluster, src, dst) > 1.0, f"TCP {label}"


def test_2_on_the_wire_vxlan_with_vni_and_no_arp_or_broadcast(cluster, tenants) -> None:
    a = tenants()
    vpc = a.vpc("prod", "10.0.0.0/16", {"web": "10.0.1.0/24"})
    v1 = a.vm("web", "hv1")
    v2 = a.vm("web", "hv2")
    assert reach(cluster, v1, v2["ip"])
    cap = underlay_capture(cluster, "hv1")
    assert ping(cluster, v1, v2["ip"], count=3)
    # a VM tries to flood: broadcast ping, ARP for an unknown address, a broadcast UDP frame
    ex(cluster, v1, "ping", "-b", "-c", "2", "-W", "1", "10.0.1.255")
    scapy_send(cluster, v1["ns"], "sendp(Ether(dst='ff:ff:ff:ff:ff:ff', src='%s')/ARP(psrc='%s', hwsrc='%s', "
               "pdst='10.0.1.200'), iface='eth0', count=2)" % (v1["mac"], v1["ip"], v1["mac"]))
    scapy_send(cluster, v1["ns"], "sendp(Ether(dst='ff:ff:ff:ff:ff:ff', src='%s')/IP(src='%s', dst='255.255.255.255')"
               "/UDP(dport=9)/b'flood', iface='eth0', count=3)" % (v1["mac"], v1["ip"]))
    frames = cap.stop()
    vx = [f for f in frames if UDP in f and f[UDP].dport == 4789]
    assert vx, "no VXLAN frames seen on the underlay"
    icmp = [f for f in vx if f.haslayer(VXLAN) and ICMP in f[VXLAN]]
    assert icmp, "the VMs' ICMP was not seen inside VXLAN"
    for f in icmp:
        assert f[VXLAN].vni == vpc["vni"]
        inner = f[VXLAN][IP]
        assert {inner.src, inner.dst} == {v1["ip"], v2["ip"]}
        assert f[VXLAN][Ether].dst in (v1["mac"], v2["mac"])
    vm_macs = {v1["mac"], v2["mac"]}
    assert not [f for f in frames if ARP in f and (f[ARP].hwsrc in vm_macs or f[ARP].psrc.startswith("10."))]
    inner_bcast = [f for f in vx if f.haslayer(VXLAN) and f[VXLAN][Ether].dst == "ff:ff:ff:ff:ff:ff"]
    assert not inner_bcast, "a broadcast crossed the underlay"
    outer_bcast = [f for f in frames if Ether in f and f[Ether].dst == "ff:ff:ff:ff:ff:ff" and ARP not in f]
    assert not outer_bcast


def test_3_isolation_with_identical_ips(cluster, tenants) -> None:
    a, b = tenants(), tenants()
    a.vpc("prod", "10.0.0.0/16", {"s": "10.0.1.0/24"})
    b.vpc("prod", "10.0.0.0/16", {"s": "10.0.1.0/24"})
    a1, a2 = a.vm("s", "hv1", ip="10.0.1.10"), a.vm("s", "hv2", ip="10.0.1.11")
    b1, b2 = b.vm("s", "hv2", ip="10.0.1.10"), b.vm("s", "hv3", ip="10.0.1.11")
    caps = {n: Capture(v["ns"], "eth0", "icmp or udp") for n, v in (("b1", b1), ("b2", b2))}
    assert reach(cluster, a1, "10.0.1.11")  # reaches a2, never b2
    assert reach(cluster, a2, "10.0.1.10")  # reaches a1, never b1
    for n, c in caps.items():
        assert c.stop() == [], f"tenant B's {n} saw tenant A's traffic"
    assert reach(cluster, b1, "10.0.1.11") and reach(cluster, b2, "10.0.1.10")  # B works on its own


def test_4_spoofing_dropped(cluster, tenants) -> None:
    a, b = tenants(), tenants()
    a.vpc("prod", "10.0.0.0/16", {"s": "10.0.1.0/24"})
    bvpc = b.vpc("prod", "10.0.0.0/16", {"s": "10.0.1.0/24"})
    a1, a2 = a.vm("s", "hv1"), a.vm("s", "hv2")
    b1 = b.vm("s", "hv2")
    assert reach(cluster, a1, a2["ip"]) and reach(cluster, b1, b1["port"]["ip"])
    cap = Capture(a2["ns"], "eth0", "icmp")
    capb = Capture(b1["ns"], "eth0", "icmp")
    send = "sendp(Ether(src='%s', dst='%s')/IP(src='%s', dst='%s')/ICMP(), iface='eth0', count=3)"
    scapy_send(cluster, a1["ns"], send % (a1["mac"], a2["mac"], "10.0.1.99", a2["ip"]))  # forged source IP
    scapy_send(cluster, a1["ns"], send % ("02:de:ad:be:ef:01", a2["mac"], a1["ip"], a2["ip"]))  # forged MAC
    # forged VXLAN from the gateway host (not a registered VTEP) with tenant B's VNI, aimed at B's VM
    hv2_vtep = cluster.state.hypervisors["hv2"]["vtep"].split("/")[0]
    gw = cluster.state.nodes["gw1"]
    scapy_send(cluster, gw["ns"], (
        "sendp(Ether(dst='ff:ff:ff:ff:ff:ff')/IP(src='%s', dst='%s')/UDP(sport=4789, dport=4789)/VXLAN(vni=%d)"
        "/Ether(dst='%s')/IP(src='10.0.1.77', dst='%s')/ICMP(), iface='ul0', count=3)")
        % (gw["underlay_ip"].split("/")[0], hv2_vtep, bvpc["vni"], b1["mac"], b1["ip"]))
    assert cap.stop() == [], "a spoofed frame was delivered"
    assert capb.stop() == [], "a forged VXLAN frame from an unregistered VTEP was delivered"
    assert reach(cluster, a1, a2["ip"])  # good traffic unaffected


def test_5_distributed_peering(cluster, tenants) -> None:
    a, b = tenants(), tenants()
    v1 = a.vpc("one", "10.1.0.0/16", {"s1": "10.1.1.0/24"})
    v2 = a.vpc("two", "10.2.0.0/16", {"s2": "10.2.1.0/24"})
    v3 = a.vpc("three", "10.3.0.0/16", {"s3": "10.3.1.0/24"})
    b.vpc("other", "10.9.0.0/16", {"sb": "10.9.1.0/24"})
    x1, x2, x3 = a.vm("s1", "hv1"), a.vm("s2", "hv3"), a.vm("s3", "hv2")
    ob = b.vm("sb", "hv3")
    pc = a.client.post("/v1/peerings", {"requester_vpc_id": v1["id"], "accepter_vpc_id": v2["id"]})
    a.client.post("/v1/peerings", {"requester_vpc_id": v2["id"], "accepter_vpc_id": v3["id"]})
    for vpc in (v1, v2, v3):  # default groups admit only members: open ICMP between the tenant's VPCs
        a.client.post(f"/v1/security-groups/{vpc['default_security_group_id']}/rules",
                      {"direction": "ingress", "protocol": "icmp", "remote_cidr": "10.0.0.0/8"})
    cluster.wait_converged()
    third = underlay_capture(cluster, "hv2", "udp port 4789")
    dest = underlay_capture(cluster, "hv3", "udp port 4789")
    assert reach(cluster, x1, x2["ip"])
    assert ping(cluster, x1, x2["ip"], count=3)
    assert third.stop() == [], "peered traffic touched a third node"
    frames = [f for f in dest.stop(until=lambda f: f.haslayer(VXLAN) and ICMP in f[VXLAN])
              if f.haslayer(VXLAN) and ICMP in f[VXLAN]]
    to_x2 = [f for f in frames if f[VXLAN][IP].dst == x2["ip"]]
    assert to_x2 and all(f[VXLAN].vni == v2["vni"] for f in to_x2), "not encapsulated with the peer VPC's VNI"
    from_x2 = [f for f in frames if f[VXLAN][IP].src == x2["ip"]]
    assert from_x2 and all(f[VXLAN].vni == v1["vni"] for f in from_x2)
    assert not reach(cluster, x1, x3["ip"], timeout=2), "peering is transitive"
    assert not reach(cluster, x1, ob["ip"], timeout=2), "a non-peered VPC is reachable"
    a.client.delete(f"/v1/peerings/{pc['id']}")
    cluster.wait_converged()
    assert not ping(cluster, x1, x2["ip"], count=2), "deleting the peering did not cut it"


def test_9_dhcp(cluster, tenants) -> None:
    a = tenants()
    a.vpc("prod", "10.0.0.0/16", {"s": "10.0.3.0/24"})
    vm = a.vm("s", "hv2", dhcp=True)
    addr = ex(cluster, vm, "ip", "-4", "-o", "addr", "show", "eth0").stdout
    assert f"inet {vm['ip']}/24" in addr
    assert "default via 10.0.3.1" in ex(cluster, vm, "ip", "route").stdout
    # the MTU comes from the switch too: reset it, renew, and it is 1450 again
    ex(cluster, vm, "ip", "link", "set", "eth0", "mtu", "1500")
    ex(cluster, vm, *own_resolv_conf(["dhclient", "-1", "-4", "-lf", f"/tmp/{vm['name']}.l2", "-pf",
                                      f"/tmp/{vm['name']}.p2", "eth0"], resolv_conf(Path("/tmp"), vm["name"])))
    wait_for(lambda: "mtu 1450" in ex(cluster, vm, "ip", "link", "show", "eth0").stdout, 10, "MTU 1450 via DHCP")
    # the DNS server is the VPC's resolver at the gateway, in the VM's resolv.conf and never in this machine's
    assert "nameserver 10.0.3.1" in resolv_conf(Path(cluster.state.dir), vm["name"]).read_text()
    assert "10.0.3.1" not in Path("/etc/resolv.conf").read_text()
    pid = open(f"/tmp/{vm['name']}.p2").read().strip()
    ex(cluster, vm, "kill", pid)


def test_10_a_vm_is_never_a_dhcp_server(cluster, tenants) -> None:
    """A VM's DHCPOFFER/ACK, broadcast or unicast to a neighbour (same host or another), never arrives; its own
    UDP from another port does (the drop is DHCP's server port only)."""
    a = tenants()
    a.vpc("prod", "10.0.0.0/16", {"s": "10.0.4.0/24"})
    rogue, near, far = a.vm("s", "hv1"), a.vm("s", "hv1"), a.vm("s", "hv2")
    assert reach(cluster, rogue, near["ip"]) and reach(cluster, rogue, far["ip"])
    caps = {vm["name"]: Capture(vm["ns"], "eth0", "udp") for vm in (near, far)}
    ack = ("sendp(Ether(src='%s', dst='%s')/IP(src='%s', dst='%s')/UDP(sport=%d, dport=68)"
           "/BOOTP(op=2, yiaddr='%s', chaddr=bytes.fromhex('%s'))/DHCP(options=[('message-type', 'ack'),"
           "('router', '%s'), 'end']), iface='eth0', count=3)")
    for vm in (near, far):
        for dst_mac, dst_ip in ((vm["mac"], vm["ip"]), ("ff:ff:ff:ff:ff:ff", "255.255.255.255")):
            scapy_send(cluster, rogue["ns"], ack % (rogue["mac"], dst_mac, rogue["ip"], dst_ip, 67, vm["ip"],
                                                   vm["mac"].replace(":", ""), rogue["ip"]))
    scapy_send(cluster, rogue["ns"], ack % (rogue["mac"], far["mac"], rogue["ip"], far["ip"], 6767, far["ip"],
                                           far["mac"].replace(":", ""), rogue["ip"]))  # not DHCP: delivered
    from scapy.layers.inet import UDP

    def ordinary(p) -> bool:
        return UDP in p and p[UDP].sport == 6767

    got = {far["name"]: caps[far["name"]].stop(until=ordinary), near["name"]: caps[near["name"]].stop()}
    assert [p for p in got[near["name"]] if UDP in p and p[UDP].sport == 67] == [], "rogue DHCP reached a neighbour"
    assert [p for p in got[far["name"]] if UDP in p and p[UDP].sport == 67] == [], "rogue DHCP crossed hosts"
    assert [p for p in got[far["name"]] if ordinary(p)], "ordinary UDP was dropped too"


def hops(cluster, vm: dict, dst: str) -> list[str]:
    """traceroute's hops from a VM (ICMP echo probes, two per hop: one lost answer on a loaded machine is not a
    missing hop), the first address that answered each, '*' where none did."""
    out = ex(cluster, vm, "traceroute", "-n", "-I", "-q", "2", "-w", "2", "-m", "4", dst, timeout=60).stdout
    lines = [line.split() for line in out.splitlines()[1:]]
    return [next((t for t in words[1:] if t.count(".") == 3), "*") for words in lines if words and words[0].isdigit()]


def test_11_traceroute_shows_the_distributed_router(cluster, tenants) -> None:
    """The routing hop answers time exceeded from the sender's subnet gateway: traceroute shows every hop, to
    another subnet and to a peered VPC, instead of a '*'."""
    a = tenants()
    v1 = a.vpc("one", "10.5.0.0/16", {"s1": "10.5.1.0/24", "s2": "10.5.2.0/24"})
    v2 = a.vpc("two", "10.6.0.0/16", {"p": "10.6.1.0/24"})
    x1, x2, peer = a.vm("s1", "hv1"), a.vm("s2", "hv2"), a.vm("p", "hv3")
    a.client.post("/v1/peerings", {"requester_vpc_id": v1["id"], "accepter_vpc_id": v2["id"]})
    a.client.post(f"/v1/security-groups/{v2['default_security_group_id']}/rules",
                  {"direction": "ingress", "protocol": "icmp", "remote_cidr": "10.5.0.0/16"})
    cluster.wait_converged()
    assert reach(cluster, x1, x2["ip"]) and reach(cluster, x1, peer["ip"])
    assert hops(cluster, x1, x2["ip"]) == ["10.5.1.1", x2["ip"]]
    assert hops(cluster, x1, peer["ip"]) == ["10.5.1.1", peer["ip"]]
    assert hops(cluster, x2, x1["ip"]) == ["10.5.2.1", x1["ip"]]  # the other way: the other subnet's gateway
