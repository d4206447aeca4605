"""Dual-stack VPCs on the emulated cluster: VMs take the IPv6 addresses the API shows (SLAAC from the router's
advertisement, DHCPv6 in a stateful subnet) and reach each other over IPv6 (ping6, TCP) on one subnet, across
subnets and across a peering (the peer's VNI on the wire; a packet longer than the peer's MTU answered packet too
big); a VM's forged router advertisement, neighbour
advertisement for another's address, spoofed source and DHCPv6 server answer reach no one; IPv6 security groups
allow and deny as written, and the analyzer (and each switch's own trace) says what the packets do."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.vxlan import VXLAN

from tests.scenarios.conftest import ex, scapy_send, underlay_capture, wait_for


def global6(cluster, vm: dict) -> set[str]:
    out = ex(cluster, vm, "ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "global").stdout
    return {line.split()[3].split("/")[0] for line in out.splitlines() if "tentative" not in line}


def link_local_ready(cluster, vm: dict) -> bool:
    out = ex(cluster, vm, "ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "link").stdout
    return "fe80::" in out and "tentative" not in out


def ping6(cluster, vm: dict, ip: str, count: int = 2) -> bool:
    return ex(cluster, vm, "ping", "-6", "-c", str(count), "-i", "0.2", "-W", "1", ip).returncode == 0


def reach6(cluster, vm: dict, ip: str, timeout: float = 8) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if ping6(cluster, vm, ip, 1):
            return True
    return False


def tcp6(cluster, client: dict, server: dict, port: int = 22) -> bool:
    """A TCP connection over IPv6 that carries 64 KB each way (TCP catches checksum and MTU trouble)."""
    srv = ("import socket; s=socket.socket(socket.AF_INET6); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1);"
           f"s.bind(('{server['ipv6']}', {port})); s.listen(1); s.settimeout(8); c, _ = s.accept(); d = b''\n"
           "while len(d) < 65536: d += c.recv(65536)\nc.sendall(d[::-1]); c.close()")
    p = subprocess.Popen(["ip", "netns", "exec", server["ns"], sys.executable, "-c", srv])
    try:
        time.sleep(0.5)
        cli = ("import socket; s=socket.create_connection(('%s', %d), timeout=4); s.sendall(b'x' * 65536); d = b''\n"
               "while len(d) < 65536:\n    b = s.recv(65536)\n    if not b: break\n    d += b\nprint(len(d))"
               % (client["to"], port))
        r = ex(cluster, client, sys.executable, "-c", cli, timeout=15)
        return r.stdout.strip() == "65536"
    finally:
        p.kill()


def dual(net, name: str, cidr: str, subnets: dict[str, tuple[str, str]], mtu: int = 1450) -> dict:
    """A dual-stack VPC: subnets name -> (IPv4 CIDR, IPv6 address mode), each with the next /64."""
    v = net.client.post("/v1/vpcs", {"name": name, "cidr": cidr, "ipv6_cidr": "auto", "mtu": mtu})
    net.vpcs[name] = v
    for sn, (c4, mode) in subnets.items():
        net.subnets[sn] = net.client.post("/v1/subnets", {"vpc_id": v["id"], "name": sn, "cidr": c4,
                                                          "ipv6_cidr": "auto", "ipv6_address_mode": mode})
    return v


def addressed(cluster, vm: dict) -> dict:
    """`vm` once its eth0 holds the address the API gave its port (SLAAC: from the router's advertisement)."""
    want = vm["port"]["ipv6"]
    try:
        wait_for(lambda: want in global6(cluster, vm), 15, f"{vm['name']} to take {want}")
    except AssertionError:
        raise AssertionError(f"{vm['name']} has {global6(cluster, vm)}, the API says {want}") from None
    return vm | {"ipv6": want}


def test_vms_take_the_apis_ipv6_addresses_and_reach_each_other(cluster, tenants) -> None:
    a = tenants()
    dual(a, "ds", "10.0.0.0/16", {"web": ("10.0.1.0/24", "slaac"), "db": ("10.0.2.0/24", "dhcpv6-stateful")})
    w1, w2 = (addressed(cluster, a.vm("web", h)) for h in ("hv1", "hv2"))
    d3 = a.vm("db", "hv3")
    wait_for(lambda: link_local_ready(cluster, d3), 10, "its link-local address (DHCPv6 is sent from it)")
    ex(cluster, d3, "dhclient", "-6", "-1", "-nw", "-lf", f"/tmp/{d3['name']}.lease6", "-pf",
       f"/tmp/{d3['name']}.pid6", "eth0", timeout=20)
    d3 = addressed(cluster, d3)
    try:
        assert reach6(cluster, w1, w2["ipv6"]), "same subnet, two hosts"
        assert reach6(cluster, w1, d3["ipv6"]), "across subnets (routed: SLAAC to DHCPv6)"
        assert tcp6(cluster, w1 | {"to": w2["ipv6"]}, w2), "TCP, same subnet"
        assert tcp6(cluster, d3 | {"to": w1["ipv6"]}, w1), "TCP, across subnets"
        hops = ex(cluster, w1, "ping", "-6", "-c", "1", "-t", "1", "-W", "1", d3["ipv6"]).stdout
        assert "Time exceeded" in hops or "Time to live exceeded" in hops, hops  # the router's hop, said
    finally:
        stop_pidfile(Path(f"/tmp/{d3['name']}.pid6"))
        for f in (f"/tmp/{d3['name']}.pid6", f"/tmp/{d3['name']}.lease6"):
            Path(f).unlink(missing_ok=True)


def stop_pidfile(path: Path) -> None:
    """Stop the process a pid file names (the VM's DHCPv6 client), by its pid."""
    try:
        os.kill(int(path.read_text().split()[0]), signal.SIGTERM)
    except (OSError, ValueError, IndexError):
        pass


def test_ipv6_over_a_peering_carries_the_peers_vni(cluster, tenants) -> None:
    a = tenants()
    v1 = dual(a, "one", "10.1.0.0/16", {"s1": ("10.1.1.0/24", "slaac")})
    v2 = dual(a, "two", "10.2.0.0/16", {"s2": ("10.2.1.0/24", "slaac")})
    a.client.post("/v1/peerings", {"requester_vpc_id": v1["id"], "accepter_vpc_id": v2["id"]})
    a.client.post(f"/v1/security-groups/{v2['default_security_group_id']}/rules",  # the peer's side lets it in
                  {"direction": "ingress", "protocol": "icmpv6", "ethertype": "IPv6", "remote_cidr": v1["ipv6_cidr"]})
    x = addressed(cluster, a.vm("s1", "hv1"))
    y = addressed(cluster, a.vm("s2", "hv2"))
    assert reach6(cluster, x, y["ipv6"])
    cap = underlay_capture(cluster, "hv1", "udp port 4789")
    assert ping6(cluster, x, y["ipv6"], 3)

    def to_y(f) -> bool:
        return UDP in f and f.haslayer(VXLAN) and IPv6 in f[VXLAN] and f[VXLAN][IPv6].dst == y["ipv6"]

    frames = [f for f in cap.stop(until=to_y, timeout=10) if to_y(f)]  # a loaded machine's capture lags
    assert frames and {f[VXLAN].vni for f in frames} == {v2["vni"]}, "sent in the peer's VNI, straight to its host"


def test_a_packet_longer_than_the_peer_vpcs_mtu_is_answered_packet_too_big(cluster, tenants) -> None:
    a = tenants()
    v1 = dual(a, "jumbo", "10.1.0.0/16", {"j1": ("10.1.1.0/24", "slaac")})
    v2 = dual(a, "small", "10.2.0.0/16", {"m1": ("10.2.1.0/24", "slaac")}, mtu=1280)
    a.client.post("/v1/peerings", {"requester_vpc_id": v1["id"], "accepter_vpc_id": v2["id"]})
    a.client.post(f"/v1/security-groups/{v2['default_security_group_id']}/rules",  # any: a later fragment has
                  {"direction": "ingress", "protocol": "any", "ethertype": "IPv6",  # no protocol (docs/dual-stack.md)
                   "remote_cidr": v1["ipv6_cidr"]})
    x = addressed(cluster, a.vm("j1", "hv1"))
    y = addressed(cluster, a.vm("m1", "hv2"))
    assert reach6(cluster, x, y["ipv6"])
    big = ex(cluster, x, "ping", "-6", "-c", "1", "-W", "1", "-M", "do", "-s", "1400", y["ipv6"])
    assert big.returncode != 0, "1,448 bytes do not fit the peer's 1,280"
    wait_for(lambda: "mtu 1280" in ex(cluster, x, "ip", "-6", "route", "get", y["ipv6"]).stdout, 5,
             "the sender to learn the path MTU from packet too big")
    assert ex(cluster, x, "ping", "-6", "-c", "2", "-i", "0.2", "-W", "1", "-M", "do", "-s", "1232",
              y["ipv6"]).returncode == 0, "what fits the peer's MTU passes"
    assert ex(cluster, x, "ping", "-6", "-c", "2", "-i", "0.2", "-W", "1", "-s", "1400",
              y["ipv6"]).returncode == 0, "the sender fragments to the path MTU it learned"


def test_datagrams_fragmented_by_their_sender_cross_a_routed_hop(cluster, tenants) -> None:
    """Conntrack reassembles them to judge them and sends the fragments on, on this host and the other."""
    a = tenants()
    dual(a, "frag", "10.1.0.0/16", {"f1": ("10.1.1.0/24", "slaac"), "f2": ("10.1.2.0/24", "slaac")})
    x = addressed(cluster, a.vm("f1", "hv1"))
    for peer in (addressed(cluster, a.vm("f2", "hv2")), addressed(cluster, a.vm("f2", "hv1"))):
        assert reach6(cluster, x, peer["ipv6"])
        for ip in (peer["ipv6"], peer["port"]["ip"]):
            r = ex(cluster, x, "ping", "-c", "2", "-i", "0.2", "-W", "1", "-s", "3000", ip)
            assert r.returncode == 0, (peer["host"], ip, r.stdout)


def routes6(cluster, vm: dict) -> str:
    """The VM's IPv6 routes, without the seconds their lifetimes have left."""
    return re.sub(r"expires \d+sec ", "", ex(cluster, vm, "ip", "-6", "route").stdout)


def neighbours(cluster, vm: dict) -> str:
    return ex(cluster, vm, "ip", "-6", "neigh", "show", "dev", "eth0").stdout


def test_forged_router_and_neighbour_advertisements_reach_no_one(cluster, tenants) -> None:
    a = tenants()
    vpc = dual(a, "ds", "10.0.0.0/16", {"web": ("10.0.1.0/24", "slaac")})
    victim = addressed(cluster, a.vm("web", "hv1"))
    peer = addressed(cluster, a.vm("web", "hv2"))
    evil = addressed(cluster, a.vm("web", "hv1"))
    assert reach6(cluster, victim, peer["ipv6"])
    routes_before = routes6(cluster, victim)
    peer_mac = peer["port"]["mac"]
    assert peer_mac in neighbours(cluster, victim)
    e = evil["port"]["mac"]
    scapy_send(cluster, evil["ns"], (  # RA: a second default router and a rogue prefix
        "sendp(Ether(src='%s', dst='33:33:00:00:00:01')/IPv6(src='fe80::bad', dst='ff02::1')/ICMPv6ND_RA()/"
        "ICMPv6NDOptPrefixInfo(prefix='2001:db8:bad::', prefixlen=64)/ICMPv6NDOptSrcLLAddr(lladdr='%s'), "
        "iface='eth0', count=3)") % (e, e))
    scapy_send(cluster, evil["ns"], (  # NA: the peer's address is at the evil MAC (override)
        "sendp(Ether(src='%s', dst='33:33:00:00:00:01')/IPv6(src='%s', dst='ff02::1')/"
        "ICMPv6ND_NA(tgt='%s', R=0, S=0, O=1)/ICMPv6NDOptDstLLAddr(lladdr='%s'), iface='eth0', count=3)")
        % (e, evil["ipv6"], peer["ipv6"], e))
    scapy_send(cluster, evil["ns"], (  # spoofed source: the victim's address
        "sendp(Ether(src='%s', dst='%s')/IPv6(src='%s', dst='%s')/ICMPv6EchoRequest(), iface='eth0', count=2)")
        % (e, vpc["router_mac"], victim["ipv6"], peer["ipv6"]))
    scapy_send(cluster, evil["ns"], (  # a DHCPv6 server's advertise
        "sendp(Ether(src='%s', dst='33:33:00:01:00:02')/IPv6(src='fe80::bad', dst='ff02::1:2')/UDP(sport=547, "
        "dport=546)/DHCP6_Advertise(), iface='eth0', count=2)") % e)
    time.sleep(1)
    assert "2001:db8:bad" not in ex(cluster, victim, "ip", "-6", "addr").stdout
    assert routes6(cluster, victim) == routes_before
    assert e not in neighbours(cluster, victim) and peer_mac in neighbours(cluster, victim)
    assert reach6(cluster, victim, peer["ipv6"])


def test_ipv6_security_groups_allow_and_deny_as_written(cluster, tenants) -> None:
    a = tenants()
    vpc = dual(a, "ds", "10.0.0.0/16", {"web": ("10.0.1.0/24", "slaac"), "app": ("10.0.2.0/24", "slaac")})
    sg = a.client.post("/v1/security-groups", {"vpc_id": vpc["id"], "name": "ssh-from-web", "rules": [
        {"direction": "egress", "ethertype": "IPv6"},
        {"direction": "ingress", "protocol": "tcp", "port_range_min": 22, "port_range_max": 22,
         "remote_cidr": a.subnets["web"]["ipv6_cidr"]}]})
    server = addressed(cluster, a.vm("app", "hv2", security_group_ids=[sg["id"]]))
    web = addressed(cluster, a.vm("web", "hv1"))
    other = addressed(cluster, a.vm("app", "hv3"))
    for src, proto, port, real in ((web, "tcp", 22, True), (web, "tcp", 23, False), (other, "tcp", 22, False),
                                   (web, "icmp", None, False)):
        got = tcp6(cluster, src | {"to": server["ipv6"]}, server, port) if proto == "tcp" else \
            ping6(cluster, src, server["ipv6"], 1)
        assert got == real, f"{src['name']} {proto}/{port}: {'passed' if got else 'refused'}"
        body = {"source_port_id": src["port"]["id"], "destination": {"ip": server["ipv6"]}, "protocol": proto} | (
            {"port": port} if port else {})
        said = a.client.post("/v1/reachability", body)
        assert (said["verdict"] == "reachable") == real, f"the analyzer says {said['verdict']}: {said['reason']}"
        live = cluster.admin.post("/v1/reachability", body | {"live": True})["live"]
        assert live["agrees"] is True, f"the switch's own trace: {live}"  # OVS's ofproto/trace, through the agent
