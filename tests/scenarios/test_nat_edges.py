"""NAT scenarios at the edges of the semantics: hairpin filtering (RFC 4787 REQ-9), every hop answering
traceroute, and datagrams bigger than the VPCs' MTU."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.scenarios.conftest import ex, scapy_send
from tests.scenarios.nat_support import gw_ready, nat_counters, nat_vpc, nat_works, served

PEER = """
import json, os, socket, sys, time
me, other, d = sys.argv[1], sys.argv[2], sys.argv[3]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("", int(sys.argv[4]))); s.settimeout(0.5)
pub = None
for _ in range(40):  # our public endpoint, as the internet's echo sees it (a loaded machine: up to 20 s)
    s.sendto(b"hi", (sys.argv[5], 9000))
    try:
        pub = s.recvfrom(100)[0].decode(); break
    except OSError:
        pass
if pub is None:
    print(json.dumps({"error": "the internet's UDP echo never answered through the NAT"})); sys.exit(1)
open(f"{d}/{me}.pub.tmp", "w").write(pub); os.rename(f"{d}/{me}.pub.tmp", f"{d}/{me}.pub")  # whole, or absent
while not os.path.exists(f"{d}/{other}.pub"):
    time.sleep(0.05)
ip, port = open(f"{d}/{other}.pub").read().split(":"); there = (ip, int(port))
got = {"before": [], "after": []}
def listen(phase, seconds):
    end = time.time() + seconds
    while time.time() < end:
        try:
            data, _ = s.recvfrom(100)
            if b":" not in data:  # not a late echo answer
                got[phase].append(data.decode())
        except OSError:
            pass
if me == "b":  # b listens, then punches towards a's endpoint, then listens again
    listen("before", 2.5); s.sendto(b"punch", there); open(f"{d}/punched", "w").close(); listen("after", 3)
else:          # a sends early (b has not sent to a), then again after b's punch
    for i in range(3):
        s.sendto(b"early", there); time.sleep(0.2)
    while not os.path.exists(f"{d}/punched"):
        time.sleep(0.05)
    time.sleep(0.3)
    for i in range(3):
        s.sendto(b"late", there); time.sleep(0.2)
    listen("after", 1)
print(json.dumps(got))
"""


def test_nat_11_hairpin_is_filtered_like_the_internet(cluster, tenants, internet, tmp_path) -> None:
    """RFC 4787: a datagram hairpinned from a neighbour's mapping meets the receiver's filter as if it came from
    the internet: refused until the receiver has sent to the sender's public endpoint, delivered after."""

    n, eip, _ = nat_vpc(tenants)
    a, b = n.vm("s", "hv1"), n.vm("s", "hv3")
    # the security group lets UDP 7000 in from anywhere: what is tested is the NAT's filter, not the group's
    n.client.post(f"/v1/security-groups/{n.vpcs['prod']['default_security_group_id']}/rules",
                  {"direction": "ingress", "protocol": "udp", "port_range_min": 7000, "port_range_max": 7000})
    gw_ready(cluster, [eip["address"]])
    nat_works(cluster, a, internet, eip["address"])
    procs = {vm["name"]: subprocess.Popen(["ip", "netns", "exec", vm["ns"], sys.executable, "-c", PEER, who, other,
                                           str(tmp_path), port, internet["ip"]], stdout=subprocess.PIPE, text=True)
             for vm, who, other, port in ((b, "b", "a", "7000"), (a, "a", "b", "7100"))}
    out = {name: json.loads(p.communicate(timeout=60)[0] or '{"error": "no output"}') for name, p in procs.items()}
    assert not [o["error"] for o in out.values() if "error" in o], out
    got_b, got_a = out[b["name"]], out[a["name"]]
    assert got_b["before"] == [], "a neighbour's mapping reached a VM that never sent to it"
    assert "late" in got_b["after"], "after sending to its neighbour's endpoint, a VM did not get its datagrams"
    assert "punch" in got_a["after"]


def test_nat_12_traceroute_to_the_internet_shows_every_hop(cluster, tenants, internet) -> None:
    """A VM's traceroute to the internet: the distributed router (its subnet gateway), the NAT gateway (from the
    EIP the VM leaves with), the server. Each routing hop takes the TTL down by one and answers when it runs out."""
    from tests.scenarios.test_overlay import hops

    n, eip, _ = nat_vpc(tenants)
    vm = n.vm("s", "hv2")
    gw_ready(cluster, [eip["address"]])
    nat_works(cluster, vm, internet, eip["address"])
    assert hops(cluster, vm, internet["ip"]) == ["10.0.1.1", eip["address"], internet["ip"]]
    # and the server sees the TTL that two hops leave
    cap = subprocess.Popen(["ip", "netns", "exec", internet["ns"], "tcpdump", "-n", "-c", "1", "-v", "-i", "any",
                            "icmp[icmptype] == icmp-echo"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           text=True)
    time.sleep(0.5)
    ex(cluster, vm, "ping", "-c", "1", "-t", "10", "-W", "2", internet["ip"])
    out, _ = cap.communicate(timeout=10)
    assert "ttl 8," in out, out


BIG_RECEIVER = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("", 7200)); s.settimeout(0.5)
for _ in range(10):
    s.sendto(b"hi", (sys.argv[1], 9000))
    try:
        print(s.recvfrom(100)[0].decode(), flush=True); break
    except OSError:
        pass
end, whole = time.time() + 30, 0  # scapy's import alone can take seconds on a loaded machine
while time.time() < end and whole < 2:
    try:
        data, _ = s.recvfrom(4096)
        print(len(data), flush=True)
        whole += len(data) == 1472
    except OSError:
        pass
"""


def test_nat_13_datagrams_bigger_than_the_vpc_mtu(cluster, tenants, internet) -> None:
    """1,500-byte UDP datagrams from the internet to a VM's mapping: without DF the gateway fragments them to the
    VPC's MTU (1450) and the VM gets them whole; with DF the sender gets fragmentation needed, MTU 1450."""
    from tests.scenarios.conftest import Capture

    n, eip, _ = nat_vpc(tenants)
    vm = n.vm("s", "hv1")
    gw_ready(cluster, [eip["address"]])
    nat_works(cluster, vm, internet, eip["address"])
    rx = subprocess.Popen(["ip", "netns", "exec", vm["ns"], sys.executable, "-c", BIG_RECEIVER, internet["ip"]],
                          stdout=subprocess.PIPE, text=True)
    pub = rx.stdout.readline().strip()
    pub_ip, _, pub_port = pub.partition(":")
    assert pub_ip == eip["address"], pub
    icmp = Capture(internet["ns"], "any", "icmp")
    scapy_send(cluster, internet["ns"], (
        "send(IP(src='%s', dst='%s')/UDP(sport=9000, dport=%s)/(b'a' * 1472), count=2)\n"
        "send(IP(src='%s', dst='%s', flags='DF')/UDP(sport=9000, dport=%s)/(b'b' * 1472), count=2)")
        % (internet["ip"], pub_ip, pub_port, internet["ip"], pub_ip, pub_port))
    out, _ = rx.communicate(timeout=60)
    sizes = [int(x) for x in out.split()]
    from scapy.layers.inet import ICMP

    def frag_needed(p) -> bool:
        return ICMP in p and p[ICMP].type == 3 and p[ICMP].code == 4

    errors = [p for p in icmp.stop(until=frag_needed) if frag_needed(p)]
    st = cluster.gateway_status(served(cluster)[eip["address"]])
    assert sizes.count(1472) >= 1, f"the VM never got the fragmented datagram: {sizes}; {st['nat']}; {errors}"
    assert errors and all(p[ICMP].nexthopmtu == 1450 for p in errors), "no fragmentation-needed for DF"
    assert st["nat"].get("fragmented", 0) >= 1 and st["nat"].get("frag_needed", 0) >= 1, st["nat"]


JUMBO_SENDER = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, 10, int(sys.argv[2]))  # IP_MTU_DISCOVER: 0 never DF, 2 always
for _ in range(3):
    try:
        s.sendto(b"j" * 3000, (sys.argv[1], 7300))
    except OSError as e:
        print("refused", e.errno, flush=True)
    time.sleep(0.3)
"""
UDP_SIZES = """
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("", 7300)); s.settimeout(0.5)
end = time.time() + 5
while time.time() < end:
    try:
        print(len(s.recvfrom(65535)[0]), flush=True)
    except OSError:
        pass
"""


def test_nat_14_a_vpc_with_a_larger_mtu_reaches_the_internet(cluster, tenants, internet) -> None:
    """A VPC with a 3,450-byte MTU (the emulation's 3,500-byte underlay): DHCP gives its VMs that MTU; a 3,000-byte
    datagram without DF reaches the internet (the gateway fragments it to the internet side's 1,500), with DF the
    VM is told the path's MTU, 1500, and keeps it for that destination (path MTU discovery works), and fragmented
    replies are reassembled by the gateway."""
    big = cluster.state.topology.get("underlay_mtu", 1500) - 50
    if big < 3450:
        pytest.fail(f"this cluster's underlay carries VPC MTUs up to {big}: the small topology sets 3500")
    n, eip, _ = nat_vpc(tenants, mtu=3450)
    vm = n.vm("s", "hv1", dhcp=True)
    assert "mtu 3450" in ex(cluster, vm, "ip", "link", "show", "eth0").stdout
    gw_ready(cluster, [eip["address"]])
    nat_works(cluster, vm, internet, eip["address"])
    for df, want in ((0, "whole"), (2, "refused")):
        rx = subprocess.Popen(["ip", "netns", "exec", internet["ns"], sys.executable, "-c", UDP_SIZES],
                              stdout=subprocess.PIPE, text=True)
        time.sleep(0.3)
        sent = ex(cluster, vm, sys.executable, "-c", JUMBO_SENDER, internet["ip"], str(df)).stdout
        sizes = [int(x) for x in rx.communicate(timeout=30)[0].split()]
        st = nat_counters(cluster)
        if want == "whole":
            assert sizes.count(3000) >= 1, f"no 3,000-byte datagram arrived: {sizes}; {st}; sender: {sent!r}"
            assert st.get("fragmented_out", 0) >= 1, st
        else:
            assert 3000 not in sizes and st.get("frag_needed_out", 0) >= 1, (sizes, st)
            route = ex(cluster, vm, "ip", "route", "get", internet["ip"]).stdout
            assert "mtu 1500" in route or "refused 90" in sent, (route, sent)
    # a 3,000-byte ping: the VM's echo leaves in fragments, the internet's reply comes back in fragments (its MTU
    # is 1500), which the gateway reassembles (RFC 4787 REQ-14) and delivers whole into the 3,450-byte VPC
    r = ex(cluster, vm, "ping", "-c", "3", "-i", "0.3", "-W", "2", "-s", "3000", "-M", "dont", internet["ip"])
    st = nat_counters(cluster)
    assert r.returncode == 0 and " 0% packet loss" in r.stdout, (r.stdout, st)
    assert st["reassembled"] >= 3, st
