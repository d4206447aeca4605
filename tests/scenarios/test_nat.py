"""NAT gateway scenarios on the emulated cluster: SNAT, 1:1 EIPs, DNAT, mapping behaviour, isolation, hostile input."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.scenarios.conftest import Net, ex, scapy_send, wait_for

WEB = """
import http.server, socketserver
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = self.client_address[0].encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
socketserver.TCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer.request_queue_size = 2048  # a listen backlog for 1,000 simultaneous clients
socketserver.ThreadingTCPServer.daemon_threads = True
socketserver.ThreadingTCPServer(("0.0.0.0", %d), H).serve_forever()
"""
UDP_ECHO = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
s.bind(("0.0.0.0", %d))
while True:
    d, a = s.recvfrom(2048); s.sendto(("%%s:%%d" %% a).encode(), a)
"""


@pytest.fixture
def internet(cluster):
    """The external host runs an HTTP server that answers with the client address it sees, and UDP echoes."""
    ns = cluster.state.nodes["inet"]["ns"]
    procs = [subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for code in (WEB % 80, UDP_ECHO % 9000, UDP_ECHO % 9001)]
    time.sleep(0.5)
    yield {"ns": ns, "ip": cluster.state.nodes["inet"]["ip"]}
    for p in procs:
        p.kill()


def nat_vpc(tenants, cidr: str = "10.0.0.0/16", subnet: str = "10.0.1.0/24") -> tuple[Net, dict, dict]:
    n = tenants()
    vpc = n.vpc("prod", cidr, {"s": subnet})
    eip = n.client.post("/v1/eips", {})
    gw = n.client.post("/v1/nat-gateways", {"vpc_id": vpc["id"], "eip_ids": [eip["id"]]})
    n.client.post(f"/v1/nat-gateways/{gw['id']}/snat-rules",
                  {"subnet_id": n.subnets["s"]["id"], "eip_ids": [eip["id"]]})
    n.client.post(f"/v1/vpcs/{vpc['id']}/routes", {"destination": "0.0.0.0/0", "target": f"nat-gateway:{gw['id']}"})
    return n, eip, gw


def own_eip_serving_8080(n: Net, vm: dict) -> dict:
    """Give the VM's port its own EIP and let TCP 8080 in through the VPC's default security group."""
    own = n.client.post("/v1/eips", {})
    n.client.post(f"/v1/eips/{own['id']}/associate", {"port_id": vm["port_id"]})
    sg = n.vpcs["prod"]["default_security_group_id"]
    n.client.post(f"/v1/security-groups/{sg}/rules", {"direction": "ingress", "protocol": "tcp",
                                                      "port_range_min": 8080, "port_range_max": 8080})
    return own


def curl(cluster, vm: dict, url: str, timeout: float = 2) -> str | None:
    r = ex(cluster, vm, "curl", "-s", "-m", str(timeout), url)
    return r.stdout if r.returncode == 0 else None


def served(cluster) -> dict[str, str]:
    """EIP -> the instance serving it now."""
    return {e: g for g in ("gw1", "gw2") for e in cluster.gateway_status(g).get("eips", [])}


def nat_works(cluster, vm: dict, internet: dict, eip: str, timeout: float = 10) -> None:
    """The VM reaches the web server, which sees `eip`; on a timeout, say what the external side believes."""
    url = f"http://{internet['ip']}/"
    try:
        wait_for(lambda: curl(cluster, vm, url) == eip, timeout, f"NAT with {eip}")
    except AssertionError as e:
        neigh = subprocess.run(["ip", "-n", internet["ns"], "neigh", "show", eip], capture_output=True,
                               text=True).stdout.strip()
        macs = {g: subprocess.run(["ip", "-n", cluster.state.nodes[g]["ns"], "-br", "link", "show", "ext0"],
                                  capture_output=True, text=True).stdout.split()[2:3] for g in ("gw1", "gw2")}
        saw = curl(cluster, vm, url)
        raise AssertionError(f"{e}; served by {served(cluster).get(eip)}; the internet's neighbour entry: "
                             f"{neigh!r}; instance MACs {macs}; the web server saw {saw!r}") from None


def gw_ready(cluster, eips: list[str]) -> None:
    wait_for(lambda: set(eips) <= set(served(cluster)), 10, "gateway config")
    cluster.wait_converged()


def test_nat_1_snat_web_sees_eip(cluster, tenants, internet) -> None:
    n, eip, _ = nat_vpc(tenants)
    vm = n.vm("s", "hv1")
    gw_ready(cluster, [eip["address"]])
    seen = None
    deadline = time.time() + 10
    while seen is None and time.time() < deadline:
        seen = curl(cluster, vm, f"http://{internet['ip']}/")
    assert seen == eip["address"], f"the web server saw {seen!r}, not the EIP"
    assert ex(cluster, vm, "ping", "-c", "3", "-i", "0.2", "-W", "1", internet["ip"]).returncode == 0  # ICMP echo
    # the cluster's instances run the best native path (DPDK is installed by make setup), and it did the work
    time.sleep(0.6)  # a status write
    statuses = [cluster.gateway_status(g) for g in ("gw1", "gw2")]
    assert all(st["fastpath"].startswith("dpdk") for st in statuses), [st["fastpath"] for st in statuses]
    assert sum(st["dataplane"]["fast_out"] + st["dataplane"]["fast_in"] for st in statuses) > 0


def test_nat_2_eip_one_to_one(cluster, tenants, internet) -> None:
    n, snat_eip, _ = nat_vpc(tenants)
    vm = n.vm("s", "hv2")
    own = own_eip_serving_8080(n, vm)
    gw_ready(cluster, [own["address"], snat_eip["address"]])
    wait_for(lambda: curl(cluster, vm, f"http://{internet['ip']}/") == own["address"], 10,
             "outbound leaves with the port's own EIP")
    web = subprocess.Popen(["ip", "netns", "exec", vm["ns"], sys.executable, "-c", WEB % 8080],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        r = subprocess.run(["ip", "netns", "exec", internet["ns"], "curl", "-s", "-m", "3",
                            f"http://{own['address']}:8080/"], capture_output=True, text=True)
        assert r.stdout == internet["ip"], "the external host could not reach the VM on its EIP"
    finally:
        web.kill()


def test_nat_3_dnat_rule(cluster, tenants, internet) -> None:
    n, snat_eip, gw = nat_vpc(tenants)
    vm = n.vm("s", "hv3")
    pub = n.client.post("/v1/eips", {})
    n.client.post(f"/v1/nat-gateways/{gw['id']}/dnat-rules", {"eip_id": pub["id"], "protocol": "tcp",
                                                              "external_port": 8443, "port_id": vm["port_id"],
                                                              "internal_port": 80})
    sg = n.vpcs["prod"]["default_security_group_id"]
    n.client.post(f"/v1/security-groups/{sg}/rules", {"direction": "ingress", "protocol": "tcp",
                                                      "port_range_min": 80, "port_range_max": 80})
    gw_ready(cluster, [pub["address"]])
    web = subprocess.Popen(["ip", "netns", "exec", vm["ns"], sys.executable, "-c", WEB % 80],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        got = None
        deadline = time.time() + 10
        while got != internet["ip"] and time.time() < deadline:
            got = subprocess.run(["ip", "netns", "exec", internet["ns"], "curl", "-s", "-m", "2",
                                  f"http://{pub['address']}:8443/"], capture_output=True, text=True).stdout
        assert got == internet["ip"]
    finally:
        web.kill()


def test_nat_4_endpoint_independent_mapping(cluster, tenants, internet) -> None:
    n, eip, _ = nat_vpc(tenants)
    vm = n.vm("s", "hv1")
    gw_ready(cluster, [eip["address"]])
    code = ("import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1); s.bind(('', 40000))\n"
            "out=[]\nfor port in (9000, 9001):\n    for _ in range(5):\n        s.sendto(b'x', ('%s', port))\n"
            "        try:\n            out.append(s.recvfrom(100)[0].decode()); break\n"
            "        except OSError: pass\nprint(' '.join(out))") % internet["ip"]
    seen = ex(cluster, vm, sys.executable, "-c", code).stdout.split()
    assert len(seen) == 2 and seen[0] == seen[1], f"different public endpoints per destination: {seen}"
    assert seen[0].startswith(eip["address"] + ":")


def test_nat_6_isolation_identical_private_ips(cluster, tenants, internet) -> None:
    a, ea, _ = nat_vpc(tenants)
    b, eb, _ = nat_vpc(tenants)
    va = a.vm("s", "hv1", ip="10.0.1.50")
    vb = b.vm("s", "hv2", ip="10.0.1.50")
    gw_ready(cluster, [ea["address"], eb["address"]])
    for vm, eip in ((va, ea), (vb, eb), (va, ea), (vb, eb)):  # each reaches the internet with its tenant's EIP
        nat_works(cluster, vm, internet, eip["address"])


def test_nat_9_hostile_packets(cluster, tenants, internet) -> None:
    n, eip, _ = nat_vpc(tenants)
    vm = n.vm("s", "hv1")
    gw_ready(cluster, [eip["address"]])
    nat_works(cluster, vm, internet, eip["address"])
    def drops(g: str) -> dict[str, int]:  # Python's and the C data plane's drop counters
        st = cluster.gateway_status(g)
        return {f"{sec}.{k}": v for sec in ("counters", "nat", "dataplane") for k, v in st.get(sec, {}).items()
                if k.startswith("drop")}

    before = {g: drops(g) for g in ("gw1", "gw2")}
    gw_ul = cluster.state.nodes["gw1"]["underlay_ip"].split("/")[0]
    hv_ns = cluster.state.hypervisors["hv3"]["ns"]
    # from the underlay: VXLAN from an unregistered source, truncated VXLAN, unknown VNI (sent from hv3's kernel
    # side, which is a registered VTEP only through br-phy: this source address is not)
    scapy_send(cluster, hv_ns, (
        "for p in [IP(src='172.31.0.200', dst='%s')/UDP(sport=1, dport=4789)/b'\\x08\\0\\0\\0', "
        "IP(src='172.31.0.200', dst='%s')/UDP(sport=1, dport=4789)/VXLAN(vni=1)/Ether()/IP(dst='1.2.3.4')/ICMP()]:\n"
        "    send(p, iface='ul0', count=3)") % (gw_ul, gw_ul))
    # from the external side: garbage, a bad-checksum IP header, a packet to an EIP with no mapping
    scapy_send(cluster, internet["ns"], (
        "sendp(Ether(dst='ff:ff:ff:ff:ff:ff')/b'\\x45\\x00garbage', iface='eth0', count=3)\n"
        "send(IP(dst='%s', chksum=0x1234)/UDP(dport=5)/b'x', iface='eth0', count=3)\n"
        "send(IP(dst='%s')/TCP(dport=33333, flags='S'), iface='eth0', count=3)") % (eip["address"], eip["address"]))
    time.sleep(2.5)
    after = {g: drops(g) for g in ("gw1", "gw2")}
    moved = {g: {k: v - before[g].get(k, 0) for k, v in after[g].items() if v != before[g].get(k, 0)}
             for g in after}
    assert all(cluster.gateway_status(g)["pid"] for g in ("gw1", "gw2"))
    assert moved["gw1"].get("counters.drop_unknown_vtep", 0) + moved["gw1"].get("dataplane.drop_unknown_vtep", 0) \
        > 0, moved  # the unregistered VTEP was sent to gw1
    assert sum(len(m) for m in moved.values()) >= 2, moved  # the external junk was counted where it arrived
    assert curl(cluster, vm, f"http://{internet['ip']}/") == eip["address"]  # good traffic unaffected
    # the counters are exported as Prometheus text on the gateway host
    gw_ns = cluster.state.nodes["gw1"]["ns"]
    text = subprocess.run(["ip", "netns", "exec", gw_ns, "curl", "-s", "http://127.0.0.1:9477/metrics"],
                          capture_output=True, text=True).stdout
    assert 'tianji_gateway_mappings{gateway="gw1"}' in text and "drop_unknown_vtep" in text


def test_nat_5_hairpin_and_icmp_errors_translated(cluster, tenants, internet) -> None:
    from tests.scenarios.conftest import Capture

    n, eip, _ = nat_vpc(tenants)
    a, b = n.vm("s", "hv1"), n.vm("s", "hv3")
    own = own_eip_serving_8080(n, b)
    gw_ready(cluster, [eip["address"], own["address"]])
    web = subprocess.Popen(["ip", "netns", "exec", b["ns"], sys.executable, "-c", WEB % 8080],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        # hairpinning: a reaches b through b's EIP, and b sees a's public address (a leaves with the SNAT EIP)
        wait_for(lambda: curl(cluster, a, f"http://{own['address']}:8080/") == eip["address"], 10, "hairpin")
    finally:
        web.kill()
    # one UDP socket: the echo service tells which public endpoint it saw, then a closed port answers with an
    # ICMP port unreachable (what ends a traceroute), which must come back translated
    cap = Capture(a["ns"], "eth0", "icmp")
    probe = ("import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('', 33434)); s.settimeout(1)\n"
             "for _ in range(5):\n    s.sendto(b'hi', ('%s', 9000))\n    try:\n"
             "        print(s.recvfrom(100)[0].decode()); break\n    except OSError: pass\n"
             "[s.sendto(b'probe', ('%s', 33434)) for _ in range(3)]") % (internet["ip"], internet["ip"])
    public = ex(cluster, a, sys.executable, "-c", probe).stdout.strip()
    pub_ip, _, pub_port = public.partition(":")
    assert pub_ip == eip["address"], public
    # fragmentation needed, crafted on the external side about that mapping (path-MTU discovery)
    time.sleep(0.5)
    # through the external host's kernel (its routing and neighbour table, like the echo that just worked)
    scapy_send(cluster, internet["ns"], (
        "import socket\norig = IP(src='%s', dst='%s')/UDP(sport=%s, dport=9000)/b'hi'\n"
        "icmp = bytes(ICMP(type=3, code=4, nexthopmtu=1300)/IPerror(bytes(orig)[:28]))\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)\n"
        "import time\nfor _ in range(3):\n    s.sendto(icmp, ('%s', 0)); time.sleep(0.2)")
        % (pub_ip, internet["ip"], pub_port, pub_ip))
    time.sleep(1.0)
    frames = cap.stop()
    from scapy.layers.inet import ICMP as _ICMP
    from scapy.layers.inet import IPerror as _IPerror
    errs = [(f[_ICMP].type, f[_ICMP].code) for f in frames if _ICMP in f and f[_ICMP].type == 3]
    assert (3, 3) in errs, f"port unreachable not translated back: {errs}"
    assert (3, 4) in errs, f"fragmentation needed not translated back: {errs} (public endpoint {public})"
    for f in frames:
        if _ICMP in f and f[_ICMP].type == 3:
            assert f[_IPerror].src == a["ip"], "the embedded header still carries the EIP"


UDP_FLOWS = """
import socket, struct, time, sys
dst, n = sys.argv[1], int(sys.argv[2])
tx = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)  # the kernel adds the IP header
rx = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
rx.settimeout(0.5)
seen = {}
def send(ports):
    for sp in ports:
        payload = b"flow"
        tx.sendto(struct.pack("!HHHH", sp, 9000, 8 + len(payload), 0) + payload, (dst, 0))
def drain():
    try:
        while True:
            data = rx.recv(2048)
            ihl = (data[0] & 15) * 4
            sp, dp = struct.unpack_from("!HH", data, ihl)
            if sp == 9000 and 20000 <= dp < 20000 + n:
                seen[dp] = data[ihl + 8:].decode()
    except OSError:
        pass
for attempt in range(10):  # like any UDP application, retry what got no answer
    missing = [p for p in range(20000, 20000 + n) if p not in seen]
    if not missing:
        break
    for i in range(0, len(missing), 500):
        send(missing[i:i + 500]); time.sleep(0.1)
    drain()
print(len(seen), len(set(seen.values())))
"""

TCP_CONNS = """
import asyncio, sys
dst, n = sys.argv[1], int(sys.argv[2])
async def one(i, gate):
    try:  # TCP retries a lost SYN for about two minutes: bounded here, so a stuck flow is counted, not waited on
        r, w = await asyncio.wait_for(asyncio.open_connection(dst, 80), 60)
    except (OSError, asyncio.TimeoutError):
        return "connect"
    await gate.wait()  # every connection is open at once before any request
    w.write(b"GET / HTTP/1.0\\r\\n\\r\\n"); await w.drain()
    try:
        data = await asyncio.wait_for(r.read(), 30)
    except (OSError, asyncio.TimeoutError):
        return "answer"
    w.close()
    return "ok" if data else "answer"
async def main():
    gate = asyncio.Event()
    tasks = [asyncio.create_task(one(i, gate)) for i in range(n)]
    await asyncio.sleep(3); gate.set()
    res = await asyncio.gather(*tasks)
    print(res.count("ok"), res.count("connect"), res.count("answer"))
asyncio.run(main())
"""


def test_nat_7_many_flows_no_collision(cluster, tenants, internet) -> None:
    n, eip, _ = nat_vpc(tenants)
    vm = n.vm("s", "hv2")
    gw_ready(cluster, [eip["address"]])
    nat_works(cluster, vm, internet, eip["address"])
    r = ex(cluster, vm, sys.executable, "-c", UDP_FLOWS, internet["ip"], "10000", timeout=120)
    answered, distinct = map(int, r.stdout.split())
    assert answered == 10000, f"only {answered} of 10,000 UDP flows got their answer: {r.stderr[-300:]}"
    assert distinct == 10000, f"{10000 - distinct} public endpoints were shared between flows"
    ex(cluster, vm, "sh", "-c", "ulimit -n 4096")
    r = ex(cluster, vm, "sh", "-c", f"ulimit -n 4096 && {sys.executable} -c '{TCP_CONNS}' {internet['ip']} 1000",
           timeout=120)
    ok, no_connect, no_answer = map(int, r.stdout.split())
    # what the failure needs to be read: the instances' NAT and data-plane counters (punt and inject rings),
    # whether one was declared down meanwhile, and where the internet host sends the EIP (its ARP entry)
    context = {g: {k: cluster.gateway_status(g).get(k) for k in ("nat", "dataplane")} for g in ("gw1", "gw2")}, \
        [(h["name"], h["status"]) for h in cluster.admin.get("/v1/hosts") if h["kind"] == "gateway"], \
        subprocess.run(["ip", "-n", internet["ns"], "neigh", "show", eip["address"]], capture_output=True,
                       text=True).stdout.strip(), \
        [line for line in (Path(cluster.state.dir) / "controller.log").read_text(errors="replace").splitlines()
         if "marked down" in line][-4:]
    assert ok == 1000, f"TCP: {no_connect} connections not established, {no_answer} without an answer: {context}"
    assert all(cluster.gateway_status(g)["nat"].get("port_exhausted", 0) == 0 for g in ("gw1", "gw2"))


def test_nat_8_failover(cluster, tenants, internet) -> None:
    """Kill the instance homing one NAT gateway: its EIPs move, new connections work within 3 s, and a flow
    through the other instance loses nothing."""
    nets = {}
    for _ in range(8):  # NAT gateways are homed by rendezvous hashing: make one land on each instance
        n, eip, _ = nat_vpc(tenants)
        gw_ready(cluster, [eip["address"]])
        nets.setdefault(served(cluster)[eip["address"]], (n, eip))
        if len(nets) == 2:
            break
    assert len(nets) == 2, "could not place NAT gateways on both instances"
    (na, ea), (nb, eb) = nets["gw1"], nets["gw2"]
    va, vb = na.vm("s", "hv1"), nb.vm("s", "hv2")
    for vm, eip in ((va, ea), (vb, eb)):  # NAT through its instance
        nat_works(cluster, vm, internet, eip["address"])
    ping = subprocess.Popen(["ip", "netns", "exec", vb["ns"], "ping", "-c", "150", "-i", "0.02", "-W", "1",
                             internet["ip"]], stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    t0 = time.monotonic()
    cluster.kill_gateway("gw1")
    try:
        wait_for(lambda: curl(cluster, va, f"http://{internet['ip']}/", timeout=0.5) == ea["address"], 3.0,
                 "a new connection through the surviving instance, with the same EIP", interval=0)
        moved_in = time.monotonic() - t0
        out, _ = ping.communicate(timeout=60)


        m = re.search(r"(\d+) packets transmitted, (\d+) received", out)
        assert m and m.group(1) == m.group(2) == "150", f"the flow on the surviving instance lost packets: {out}"
        assert served(cluster)[ea["address"]] == "gw2"
        assert moved_in < 3.0
    finally:
        cluster.start_gateway("gw1")
        cluster.wait_gateways(timeout=30)


def test_nat_10_one_gateway_spread_over_both_instances(cluster, tenants, internet) -> None:
    """A NAT gateway with EIPs homed on both instances: VMs are split by source address between them, each VM's
    flows leave with an EIP of the instance serving its bucket, and both instances carry traffic."""
    from controller.placement import NAT_BUCKETS, home, nat_buckets

    live = {"gw1": "x", "gw2": "x"}
    n = tenants()
    vpc = n.vpc("prod", "10.0.0.0/16", {"s": "10.0.1.0/24"})
    eips: dict[str, dict] = {}
    for _ in range(12):  # two EIPs, one homed on each instance (homes are rendezvous hashes of the EIP id)
        e = n.client.post("/v1/eips", {})
        eips.setdefault(home(f"eip:{e['id']}", live), e)
        if len(eips) == 2:
            break
    assert len(eips) == 2, "could not find EIPs homed on both instances"
    gw = n.client.post("/v1/nat-gateways", {"vpc_id": vpc["id"], "eip_ids": [e["id"] for e in eips.values()]})
    n.client.post(f"/v1/nat-gateways/{gw['id']}/snat-rules",
                  {"subnet_id": n.subnets["s"]["id"], "eip_ids": [e["id"] for e in eips.values()]})
    n.client.post(f"/v1/vpcs/{vpc['id']}/routes", {"destination": "0.0.0.0/0", "target": f"nat-gateway:{gw['id']}"})
    # one VM address in a bucket of each instance
    pick: dict[str, str] = {}
    # the controller's own assignment: rendezvous hashing alone leaves an instance without a bucket 1 time in 128
    # here, and nat_buckets then feeds it one (computing the homes here without that made this test flaky)
    buckets = nat_buckets(gw["id"], sorted(e["id"] for e in eips.values()), live)
    for last in range(10, 10 + 4 * NAT_BUCKETS):
        pick.setdefault(buckets[last % NAT_BUCKETS], f"10.0.1.{last}")
    assert set(pick) == {"gw1", "gw2"}
    vms = {inst: n.vm("s", "hv1" if inst == "gw1" else "hv2", ip=ip) for inst, ip in pick.items()}
    gw_ready(cluster, [e["address"] for e in eips.values()])
    before = {g: cluster.gateway_status(g)["nat"].get("mappings_created", 0) for g in ("gw1", "gw2")}
    for inst, vm in vms.items():
        seen = None
        deadline = time.time() + 10
        while seen is None and time.time() < deadline:
            seen = curl(cluster, vm, f"http://{internet['ip']}/")
        assert seen == eips[inst]["address"], f"{vm['ip']} (served by {inst}) left as {seen!r}"
    time.sleep(0.6)
    after = {g: cluster.gateway_status(g)["nat"].get("mappings_created", 0) for g in ("gw1", "gw2")}
    assert all(after[g] > before[g] for g in after), (before, after)


PEER = """
import json, os, socket, sys, time
me, other, d = sys.argv[1], sys.argv[2], sys.argv[3]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("", int(sys.argv[4]))); s.settimeout(0.5)
for _ in range(10):  # our public endpoint, as the internet's echo sees it
    s.sendto(b"hi", (sys.argv[5], 9000))
    try:
        pub = s.recvfrom(100)[0].decode(); break
    except OSError:
        pass
open(f"{d}/{me}.pub", "w").write(pub)
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
    import json

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
    out = {name: json.loads(p.communicate(timeout=30)[0]) for name, p in procs.items()}
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
end = time.time() + 6
while time.time() < end:
    try:
        data, _ = s.recvfrom(4096)
        print(len(data), flush=True)
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
    out, _ = rx.communicate(timeout=30)
    sizes = [int(x) for x in out.split()]
    from scapy.layers.inet import ICMP

    def frag_needed(p) -> bool:
        return ICMP in p and p[ICMP].type == 3 and p[ICMP].code == 4

    errors = [p for p in icmp.stop(until=frag_needed) if frag_needed(p)]
    st = cluster.gateway_status(served(cluster)[eip["address"]])
    assert sizes.count(1472) >= 1, f"the VM never got the fragmented datagram: {sizes}; {st['nat']}; {errors}"
    assert errors and all(p[ICMP].nexthopmtu == 1450 for p in errors), "no fragmentation-needed for DF"
    assert st["nat"].get("fragmented", 0) >= 1 and st["nat"].get("frag_needed", 0) >= 1, st["nat"]
