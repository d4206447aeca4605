"""Private lines on the emulated cluster: the on-premise site `site1` runs FRR as the customer's edge router on a
VLAN of its trunk to the handoff, where the private-line instances pl1 and pl2 carry the line's two BGP sessions.

1. A VM and a host on the site's LAN reach each other (ping, TCP); the handoff carries the line's VLAN tag, the
   underlay the VPC's VNI.
2. BGP: the site's prefixes become the VPC's routes (origin bgp) and the vSwitch's flows; withdrawn, they go; the
   site learns the VPC's CIDR and not a peered VPC's.
3. Two tenants on two VLANs of the same handoff, with the same CIDRs on both sides, stay apart.
5. Bad routes: over max_prefixes (session down, the status says so), a prefix inside the VPC (refused, reported),
   an MD5 mismatch (no session, the status says so).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.scenarios.conftest import WEB, Capture, Net, ex, ping, wait_for
from topologies.site import Neighbor, SiteRouter

CLOUD_ASN = 64512
LAN_HOST = "192.168.10.10"


@pytest.fixture(scope="module")
def site(cluster) -> SiteRouter:
    return SiteRouter(cluster.state, "site1").start()


def line_vpc(tenants, vlan: int, cidr: str = "10.0.0.0/16", subnet: str = "10.0.1.0/24", secondary: bool = True,
             **line_kw) -> tuple[Net, dict, dict, dict]:
    """A tenant's VPC with a VM on hv1 that the site's LAN may reach, and a private line on `vlan` (its primary
    pair 169.254.V.0/30, the secondary 169.254.V+1.0/30, V = vlan % 250)."""
    n = tenants()
    vpc = n.vpc("prod", cidr, {"s": subnet})
    sg = vpc["default_security_group_id"]
    n.client.post(f"/v1/security-groups/{sg}/rules", {"direction": "ingress", "protocol": "any",
                                                      "remote_cidr": "192.168.0.0/16"})
    vm = n.vm("s", "hv1")
    v = vlan % 250
    body = {"name": "dc1", "vpc_id": vpc["id"], "vlan_id": vlan, "customer_asn": 65010,
            "customer_ip": f"169.254.{v}.2/30", "local_ip": f"169.254.{v}.1/30"} | line_kw
    if secondary:
        body["secondary"] = {"customer_ip": f"169.254.{v + 1}.2/30", "local_ip": f"169.254.{v + 1}.1/30"}
    line = n.client.post("/v1/private-lines", body)
    return n, vpc, vm, line


def site_for(site: SiteRouter, line: dict, password: str | None = None, networks: list[str] | None = None,
             extra: list[str] = ()) -> None:
    """The site's end of every session of the line, and its BGP to them."""
    pairs = [(line["customer_ip"], line["local_ip"])]
    if line["secondary"]:
        pairs.append((line["secondary"]["customer_ip"], line["secondary"]["local_ip"]))
    site.add_vlan(line["vlan_id"], pairs[0][0])
    for cust, _ in pairs[1:]:
        subprocess.run(["ip", "-n", site.ns, "addr", "replace", cust, "dev", f"v{line['vlan_id']}"], check=True)
    site.bgp([Neighbor(local.split("/")[0], CLOUD_ASN, password) for _, local in pairs], networks, extra)


def sessions(n: Net, line: dict) -> list[dict]:
    return n.client.get(f"/v1/private-lines/{line['id']}")["sessions"]


def established(n: Net, line: dict, count: int = 2, timeout: float = 40) -> None:
    try:
        wait_for(lambda: sum(s["bgp_state"] == "Established" for s in sessions(n, line)) >= count, timeout,
                 f"{count} BGP sessions of line {line['id']} established", interval=0.5)
    except AssertionError as e:
        raise AssertionError(f"{e}: {json.dumps(sessions(n, line), indent=1)}") from None


def bgp_routes(n: Net, vpc: dict) -> dict[str, dict]:
    return {r["destination"]: r for r in n.client.get(f"/v1/vpcs/{vpc['id']}/routes") if r["origin"] == "bgp"}


def test_pl_1_a_vm_and_the_site_reach_each_other_tagged_on_the_handoff(cluster, tenants, site) -> None:
    n, vpc, vm, line = line_vpc(tenants, 100)
    assert {s["instance"] for s in line["sessions"]} == {"pl1", "pl2"}
    site_for(site, line)
    established(n, line)
    wait_for(lambda: "192.168.10.0/24" in bgp_routes(n, vpc), 10, "the site's LAN in the VPC's routes")
    cluster.wait_converged()
    st = cluster.state
    handoff = [Capture(None, f"{st.name}{g}h"[:15], "vlan 100 and icmp") for g in ("pl1", "pl2")]
    underlay = [Capture(None, _ul_end(cluster, g), "udp port 4789")
                for g in ("pl1", "pl2")]
    before = {g: line_counters(cluster, g) for g in ("pl1", "pl2")}
    assert wait_for(lambda: ping(cluster, vm, LAN_HOST, count=1), 10, "the VM pinging the site's LAN host") < 10
    r = site.lan_exec("ping", "-c", "3", "-i", "0.2", "-W", "1", vm["ip"])
    assert r.returncode == 0, r.stdout + r.stderr
    web = subprocess.Popen(["ip", "netns", "exec", vm["ns"], sys.executable, "-c", WEB % 8080],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:  # TCP from the site to the VM: the VM sees the on-premise address itself (no NAT on a private line)
        got = wait_for(lambda: site.lan_exec("curl", "-s", "-m", "2", f"http://{vm['ip']}:8080/").stdout == LAN_HOST,
                       10, "TCP from the site's LAN host to the VM")
        assert got < 10
    finally:
        web.kill()
    from scapy.all import ICMP, UDP, VXLAN, Dot1Q

    tagged = [p for c in handoff for p in c.stop() if p.haslayer(Dot1Q) and p.haslayer(ICMP)]
    assert tagged and all(p[Dot1Q].vlan == 100 for p in tagged)
    vx = [p for c in underlay for p in c.stop() if p.haslayer(VXLAN) and p.haslayer(UDP)]
    assert vx and {p[VXLAN].vni for p in vx} == {vpc["vni"]}
    # both ways in the native stage, not punted to Python (the ARPs and the sessions' frames are)
    time.sleep(0.6)  # the status file is rewritten every 0.5 s
    moved = [sum(x) for x in zip(*(tuple(a - b for a, b in zip(line_counters(cluster, g), before[g], strict=True))
                                   for g in before), strict=True)]
    assert moved[0] >= 3 and moved[1] >= 3, moved


def line_counters(cluster, gateway: str) -> tuple[int, int]:
    """(out to the handoff, in from it) moved by the instance's C stage."""
    st = cluster.gateway_status(gateway)
    assert st["fastpath"].split()[0] in ("dpdk", "xdp", "packet"), st["fastpath"]
    return st["dataplane"].get("line_out", 0), st["dataplane"].get("line_in", 0)


def _ul_end(cluster, node: str) -> str:
    from topologies.wiring import underlay_end

    return underlay_end(cluster.state.name, node)


def test_pl_2_learned_routes_follow_the_site_and_peering_is_not_transitive(cluster, tenants, site) -> None:
    n, vpc, vm, line = line_vpc(tenants, 110)
    other = n.vpc("peer", "10.5.0.0/16", {"p": "10.5.1.0/24"})
    pc = n.client.post("/v1/peerings", {"requester_vpc_id": vpc["id"], "accepter_vpc_id": other["id"]})
    assert pc["status"] == "active"
    site_for(site, line, networks=["192.168.10.0/24", "192.168.20.0/24"])
    established(n, line)
    t0 = time.monotonic()
    wait_for(lambda: {"192.168.10.0/24", "192.168.20.0/24"} <= bgp_routes(n, vpc).keys(), 15,
             "both site prefixes in the VPC's routes")
    hv1 = cluster.hypervisor("hv1")
    wait_for(lambda: "192.168.20.0/24" in hv1.ofctl("dump-flows", "br-int", "table=40"), 10,
             "the vSwitch routing 192.168.20.0/24")
    learned_s = time.monotonic() - t0
    got = json.loads(site.vtysh("show ip bgp json"))["routes"]
    assert "10.0.0.0/16" in got and "10.5.0.0/16" not in got  # the VPC, not its peer
    site.bgp([Neighbor(s["local_ip"].split("/")[0], CLOUD_ASN) for s in sessions(n, line)], ["192.168.10.0/24"])
    wait_for(lambda: "192.168.20.0/24" not in bgp_routes(n, vpc), 20, "the withdrawn prefix gone")
    wait_for(lambda: "192.168.20.0/24" not in hv1.ofctl("dump-flows", "br-int", "table=40"), 10,
             "the vSwitch's route withdrawn")
    print(f"learned -> in the vSwitch: {learned_s:.2f} s")


def serve_name(ns: str, name: str, port: int = 8080) -> subprocess.Popen:
    """An HTTP server in namespace `ns` answering its own `name`: who answered, seen from the client."""
    code = ("import http.server, socketserver\n"
            "class H(http.server.BaseHTTPRequestHandler):\n"
            f"    def do_GET(self):\n        b = {name!r}.encode()\n"
            "        self.send_response(200); self.send_header('Content-Length', str(len(b))); self.end_headers()\n"
            "        self.wfile.write(b)\n    def log_message(self, *a): pass\n"
            f"socketserver.TCPServer.allow_reuse_address = True\nsocketserver.TCPServer(('0.0.0.0', {port}), H)"
            ".serve_forever()\n")
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def test_pl_3_two_tenants_same_cidrs_two_vlans_stay_apart(cluster, tenants, site) -> None:
    """Two customers (site1, site2) with the same LAN, into two tenants' VPCs with the same CIDR, on two VLANs of
    the one handoff: each VM reaches its own site's host and that host only, and the reverse."""
    site2 = SiteRouter(cluster.state, "site2").start()
    a, va, vm_a, la = line_vpc(tenants, 120, secondary=False)
    b, vb, vm_b, lb = line_vpc(tenants, 121, secondary=False)
    assert vm_a["ip"] == vm_b["ip"] and va["cidr"] == vb["cidr"]
    site_for(site, la)
    site_for(site2, lb)
    established(a, la, 1)
    established(b, lb, 1)
    for n, vpc in ((a, va), (b, vb)):
        wait_for(lambda n=n, vpc=vpc: "192.168.10.0/24" in bgp_routes(n, vpc), 10, "the site's route")
    cluster.wait_converged()
    servers = [serve_name(site.lan_ns, "site1"), serve_name(site2.lan_ns, "site2"),
               serve_name(vm_a["ns"], "vm-a"), serve_name(vm_b["ns"], "vm-b")]
    try:
        for vm, want in ((vm_a, "site1"), (vm_b, "site2")):
            wait_for(lambda vm=vm, want=want: ex(cluster, vm, "curl", "-s", "-m", "2",
                                                 f"http://{LAN_HOST}:8080/").stdout == want, 15,
                     f"{vm['name']} reaching {want}'s host only")
        for s_, want in ((site, "vm-a"), (site2, "vm-b")):
            wait_for(lambda s_=s_, want=want: s_.lan_exec("curl", "-s", "-m", "2",
                                                        f"http://{vm_a['ip']}:8080/").stdout == want, 15,
                     f"{s_.site} reaching {want} only")
    finally:
        for p in servers:
            p.kill()


def test_pl_5_bad_routes_are_refused_and_said(cluster, tenants, site) -> None:
    n, vpc, vm, line = line_vpc(tenants, 130, secondary=False, max_prefixes=3, md5_password="right-key")
    # an MD5 mismatch: no session, and the status says why
    site_for(site, line, password="wrong-key")
    wait_for(lambda: any("MD5" in (s["last_error"] or "") for s in sessions(n, line)), 30, "MD5 mismatch reported",
             interval=0.5)
    assert all(s["bgp_state"] != "Established" for s in sessions(n, line))
    # the right key, a prefix inside the VPC: refused, reported, not routed
    site_for(site, line, password="right-key", networks=["192.168.10.0/24", "10.0.9.0/24"])
    established(n, line, 1)
    wait_for(lambda: any(r["prefix"] == "10.0.9.0/24" for s in sessions(n, line) for r in s["refused"]), 10,
             "the overlapping prefix refused")
    assert "10.0.9.0/24" not in bgp_routes(n, vpc) and "192.168.10.0/24" in bgp_routes(n, vpc)
    # more than max_prefixes: the session is torn down, and the status says so, and when it retries
    site_for(site, line, password="right-key", networks=[f"192.168.{i}.0/24" for i in range(30, 35)])
    wait_for(lambda: any("retries by itself at" in (s["last_error"] or "") for s in sessions(n, line)), 30,
             "max-prefix reported with its retry", interval=0.5)
    assert not bgp_routes(n, vpc)
    # the site withdraws the excess: the session comes back by itself (bgpd's restart timer: a minute)
    t0 = time.monotonic()
    site_for(site, line, password="right-key", networks=["192.168.10.0/24"])
    established(n, line, 1, timeout=100)
    wait_for(lambda: "192.168.10.0/24" in bgp_routes(n, vpc), 20, "the site's route back")
    print(f"max-prefix teardown recovered by itself {time.monotonic() - t0:.0f} s after the excess was withdrawn")


def test_pl_4_failover_an_instance_killed_under_a_20ms_ping(cluster, tenants, site) -> None:
    """Kill the instance carrying the VM's way out while it pings the site every 20 ms: the vSwitch moves to the
    other instance once the controller sees it silent, the site once BFD does (0.9 s); the loss is measured."""
    n, vpc, vm, line = line_vpc(tenants, 140)
    site_for(site, line)
    established(n, line)
    wait_for(lambda: "192.168.10.0/24" in bgp_routes(n, vpc), 10, "the site's route")
    cluster.wait_converged()
    assert wait_for(lambda: ping(cluster, vm, LAN_HOST, count=1), 10, "the VM reaching the site") < 10
    before = {g: cluster.gateway_status(g)["counters"].get("line_out", 0) for g in ("pl1", "pl2")}
    ping(cluster, vm, LAN_HOST, count=5)
    victim = max(before, key=lambda g: cluster.gateway_status(g)["counters"].get("line_out", 0) - before[g])
    speakers = namespaces_of(cluster, victim)
    assert speakers, f"{victim} runs no session"
    proc = pinger(vm)
    try:
        time.sleep(2)
        os.kill(cluster.state.nodes[victim]["pid"], signal.SIGKILL)  # the instance alone, not its group
        sent, got = pinged(proc)
        # its FRR went with it: nothing runs in its speakers' namespaces, which are gone
        wait_for(lambda: not any(ns in listed_netns() for ns in speakers), 5, f"{victim}'s speakers reaped")
    finally:
        proc.kill()
    lost_ms = (sent - got) * 20
    print(f"failover of {victim}: {sent - got} of {sent} pings lost at 20 ms: {lost_ms} ms")
    assert lost_ms < 1000, f"{sent - got} pings lost ({lost_ms} ms) when {victim} died"
    # the instance comes back: the sessions stay where they run, and no ping is lost
    established(n, line, timeout=60)
    placed = [s["instance"] for s in sessions(n, line)]
    proc = pinger(vm, count=500)
    time.sleep(1)
    cluster.start_gateway(victim)
    cluster.wait_gateways(timeout=30)
    sent, got = pinged(proc)
    print(f"return of {victim}: {sent - got} of {sent} pings lost at 20 ms")
    assert [s["instance"] for s in sessions(n, line)] == placed
    assert got == sent, f"{sent - got} pings lost when {victim} came back"
    # the operator's rebalance puts a session back on it: the other session carries meanwhile
    cluster.admin.post(f"/v1/private-lines/{line['id']}/rebalance", {})
    established(n, line, timeout=60)
    assert victim in [s["instance"] for s in sessions(n, line)]


def pinger(vm: dict, count: int = 400) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", vm["ns"], "ping", "-i", "0.02", "-c", str(count), "-W", "1",
                             LAN_HOST], stdout=subprocess.PIPE, text=True)


def pinged(proc: subprocess.Popen) -> tuple[int, int]:
    out = proc.communicate(timeout=60)[0]
    summary = next(x for x in out.splitlines() if "transmitted" in x).split(",")  # "N transmitted, M received"
    return int(summary[0].split()[0]), int(summary[1].split()[0])


def namespaces_of(cluster, instance: str) -> list[str]:
    """The namespaces the instance's BGP speakers run in (each speaker's directory names its owner)."""
    lines = Path(cluster.state.dir) / "gateways" / "lines"
    return [d.parent.name for d in lines.glob("*/owner") if d.read_text().strip() == instance
            and d.parent.name in listed_netns()]


def listed_netns() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {x.split()[0] for x in out.splitlines() if x.strip()}


def test_pl_6_nothing_but_the_lines_traffic_on_the_handoff(cluster, tenants, site) -> None:
    """While a line's sessions come up, and while an instance restarts, the private-line instances send nothing of
    their kernels' own onto the handoff: no IPv6 (router solicitations, DAD), no untagged frame."""
    from scapy.all import Dot1Q, Ether

    ends = {g: f"{cluster.state.name}{g}h"[:15] for g in ("pl1", "pl2")}
    caps = {g: Capture(None, end) for g, end in ends.items()}
    try:
        n, vpc, vm, line = line_vpc(tenants, 150)
        site_for(site, line)
        established(n, line, timeout=60)
        cluster.kill_gateway("pl2")
        cluster.start_gateway("pl2")
        cluster.wait_gateways(timeout=30)
        established(n, line, timeout=60)
        time.sleep(3)  # a router solicitation comes a second or so after its link is up
    finally:
        frames = {g: c.stop() for g, c in caps.items()}
    for g, got in frames.items():
        mac = subprocess.run(["ip", "-n", cluster.state.nodes[g]["ns"], "-j", "link", "show", "ho0"],
                             capture_output=True, text=True, check=True).stdout
        mac = json.loads(mac)[0]["address"]
        ours = [f for f in got if Ether in f and f[Ether].src == mac]  # what the instance (and its speakers) sent
        assert ours, f"nothing captured from {g} ({mac})"
        untagged = [f.summary() for f in ours if Dot1Q not in f]
        ipv6 = [f.summary() for f in ours if f[Ether].type == 0x86DD or Dot1Q in f and f[Dot1Q].type == 0x86DD]
        assert ipv6 == [], f"IPv6 from {g} on the handoff: {ipv6[:5]}"
        assert untagged == [], f"untagged frames from {g} on the handoff: {untagged[:5]}"
