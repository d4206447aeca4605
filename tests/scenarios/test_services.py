"""Services outside every VPC, reached through endpoints (the VPC gateway to the cluster's services). The cluster's
service network holds an object store (100.100.0.10:80) and a database-like service that asks for PROXY v2
(100.100.0.20:5432); instances of role `service` (svc1, svc2) serve the endpoints.

* Two tenants with identical CIDRs and identical VM addresses fetch from the store through their endpoints; the
  store sees two different sources (each endpoint's own), and the database reads each endpoint's id in its PROXY
  header, at the start of a TCP stream and in front of every UDP datagram.
* A VPC without an endpoint reaches nothing on the service network (a capture there shows nothing); a VPC peered
  with one that has an endpoint reaches it, only while peered.
* The endpoint's name resolves from the resolver DHCP names; another tenant's VM on the same hypervisor does not
  resolve it; deleting the endpoint cuts the traffic and the name.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.scenarios.conftest import ex, ping, wait_for

RESOLVE = r"""
import socket, struct, sys
name, server = sys.argv[1], sys.argv[2]
q = struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + b"".join(
    bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack("!HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
s.sendto(q, (server, 53))
a = s.recv(512)
ident, flags, _, an = struct.unpack_from("!HHHH", a)
assert ident == 0x1234, ident
print(a[-4:] and socket.inet_ntoa(a[-4:]) if an else f"rcode {flags & 15}")
"""


def nameserver(cluster, vm: dict) -> str:
    conf = (Path(cluster.state.dir) / f"{vm['name']}.resolv.conf").read_text()
    return next(line.split()[1] for line in conf.splitlines() if line.startswith("nameserver"))


def resolve(cluster, vm: dict, name: str, server: str) -> str:
    r = ex(cluster, vm, sys.executable, "-c", RESOLVE, name, server)
    return r.stdout.strip() if r.returncode == 0 else f"failed: {r.stderr.strip()[-200:]}"


def _service(cluster, name: str, kind: str, extra_ports: tuple = (), **kw):
    addr, port = cluster.service_address(kind)
    svc = cluster.admin.post("/v1/services", {"name": name, "addresses": [addr],
                                              "ports": [{"protocol": "tcp", "port": port}, *extra_ports]} | kw)
    yield svc
    for e in cluster.admin.get("/v1/service-endpoints"):
        if e["service_id"] == svc["id"]:
            cluster.admin.delete(f"/v1/service-endpoints/{e['id']}")
    cluster.admin.delete(f"/v1/services/{svc['id']}")


@pytest.fixture
def store(cluster):
    yield from _service(cluster, "store", "store", ({"protocol": "udp", "port": CLOSED_UDP},))


@pytest.fixture
def db(cluster):
    yield from _service(cluster, "db", "db", ({"protocol": "udp", "port": cluster.service_address("db")[1]},),
                        proxy_protocol=True)


def endpoint(n, svc: dict, subnet: str = "s", vpc: str = "prod") -> dict:
    return n.client.post("/v1/service-endpoints", {"vpc_id": n.vpcs[vpc]["id"], "subnet_id": n.subnets[subnet]["id"],
                                                   "service_id": svc["id"]})


def http_get(cluster, vm: dict, url: str, timeout: int = 3) -> str | None:
    r = ex(cluster, vm, "curl", "-s", "-m", str(timeout), "-o", "-", "-w", "", url, timeout=timeout + 10)
    return r.stdout if r.returncode == 0 else None


CLOSED_UDP = 9999  # a port of the store's service nothing listens on: the store's kernel answers port unreachable
REFUSED = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2); s.connect((sys.argv[1], int(sys.argv[2])))
s.send(b"anyone?")
try:
    s.recv(100); print("answered")
except ConnectionRefusedError:
    print("refused")
except OSError as e:
    print("nothing", e)
"""
TALK = r"""
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
f = s.makefile("rb")
banner = f.readline().decode().strip()
s.sendall(b"select 1\n")
print(banner, "|", f.readline().decode().strip())
"""
DATAGRAM = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3); s.bind(("0.0.0.0", 40123))
s.sendto(b"select 2\n", (sys.argv[1], int(sys.argv[2])))
print(s.recv(1000).decode().strip())
"""


def test_svc_dns_endpoint_names_resolve_from_the_resolver_dhcp_names(cluster, tenants, store) -> None:
    a, b = tenants(), tenants()
    for n in (a, b):
        n.vpc("prod", "10.60.0.0/16", {"s": "10.60.1.0/24"})
    vm_a, vm_b = a.vm("s", "hv1", dhcp=True), b.vm("s", "hv1", dhcp=True)
    server = nameserver(cluster, vm_a)
    assert server == "10.60.1.1" == nameserver(cluster, vm_b)  # the subnet's gateway
    ep = a.client.post("/v1/service-endpoints", {"vpc_id": a.vpcs["prod"]["id"], "subnet_id": a.subnets["s"]["id"],
                                                 "service_id": store["id"]})
    assert ep["dns_name"] == "store.prod.internal"
    wait_for(lambda: resolve(cluster, vm_a, ep["dns_name"], server) == ep["address"], 10,
             f"{ep['dns_name']} resolving to {ep['address']} from the VM")
    assert resolve(cluster, vm_b, ep["dns_name"], server) == "rcode 3"  # NXDOMAIN: not in b's VPC
    assert resolve(cluster, vm_a, "example.com", server) == "rcode 5"  # no forwarder on the cluster: refused
    a.client.delete(f"/v1/service-endpoints/{ep['id']}")
    wait_for(lambda: resolve(cluster, vm_a, ep["dns_name"], server) == "rcode 3", 10, "the name gone with it")


def test_svc_identical_tenants_reach_the_store_and_the_service_tells_them_apart(cluster, tenants, store, db) -> None:
    """Same CIDR, same VM address, two tenants: each fetches through its own endpoint; the store sees each
    endpoint's own source address, the database each endpoint's id in its PROXY v2 header, never the other's."""
    nets, vms, eps, dbs = [tenants(), tenants()], [], [], []
    for n, host in zip(nets, ("hv1", "hv2"), strict=True):
        n.vpc("prod", "10.61.0.0/16", {"s": "10.61.1.0/24"})
        vms.append(n.vm("s", host, ip="10.61.1.10"))
        eps.append(endpoint(n, store))
        dbs.append(endpoint(n, db))
    assert eps[0]["address"] == eps[1]["address"]  # identical subnets, identical endpoint addresses
    sources = [e["source_address"] for e in eps]
    assert sources[0] != sources[1] and all(s.startswith("100.100.") for s in sources), sources
    for vm, ep, src in zip(vms, eps, sources, strict=True):
        wait_for(lambda vm=vm, ep=ep: http_get(cluster, vm, f"http://{ep['address']}/whoami", 1) is not None, 20,
                 f"the store through endpoint {ep['id']}")
        assert http_get(cluster, vm, f"http://{ep['address']}/whoami") == src
        assert http_get(cluster, vm, f"http://{ep['address']}/objects/hello.txt") == \
            "hello from the cluster's object store\n"
    for vm, ep in zip(vms, dbs, strict=True):
        r = ex(cluster, vm, sys.executable, "-c", TALK, ep["address"], "5432")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == f"READY endpoint={ep['id']} vm=10.61.1.10 source={ep['source_address']} | " \
                                   "OK select 1", r.stdout
        r = ex(cluster, vm, sys.executable, "-c", DATAGRAM, ep["address"], "5432")  # UDP: a header per datagram
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == f"READY endpoint={ep['id']} vm=10.61.1.10 source={ep['source_address']} | " \
                                   "OK select 2", r.stdout
    # the service sees connections through an endpoint only: ping answers from the endpoint itself
    assert ping(cluster, vms[0], eps[0]["address"])


def test_svc_a_vpc_without_an_endpoint_reaches_nothing_on_the_service_network(cluster, tenants, store) -> None:
    """A VPC with an endpoint next to one without: the second's VM tries the service's own address, and the first
    one's endpoint address (in a VPC that is not its own): the service network's capture holds none of it."""
    from tests.scenarios.conftest import Capture

    a, b = tenants(), tenants()
    a.vpc("prod", "10.62.0.0/16", {"s": "10.62.1.0/24"})
    b.vpc("prod", "10.63.0.0/16", {"s": "10.63.1.0/24"})
    vm_a, vm_b = a.vm("s", "hv1"), b.vm("s", "hv1")
    ep = endpoint(a, store)
    wait_for(lambda: http_get(cluster, vm_a, f"http://{ep['address']}/whoami", 1) is not None, 20, "the store")
    host = next(i for i in cluster.state.nodes.values() if "store" in i.get("services", {}))
    cap = Capture(host["ns"], "eth0", "ip and not arp")
    addr, port = cluster.service_address("store")
    for target in (addr, ep["address"], "100.100.0.20"):
        assert http_get(cluster, vm_b, f"http://{target}:{port}/whoami", 2) is None
    assert not ping(cluster, vm_b, addr, count=2)
    seen = cap.stop()
    assert seen == [], [p.summary() for p in seen]


def test_svc_a_peered_vpcs_vms_reach_the_endpoint_and_only_while_peered(cluster, tenants, store) -> None:
    """Hub and spoke: the endpoint lives in the hub; a VM of a spoke peered with the hub fetches through it (its
    vSwitch tunnels with the hub's VNI to the instance, the replies come back in the spoke's); a VPC not peered has
    no way there, the endpoint's rules admitting it or not; the peering gone, so is the way."""
    n = tenants()
    hub = n.vpc("prod", "10.65.0.0/16", {"s": "10.65.1.0/24"})
    spoke = n.vpc("spoke", "10.66.0.0/16", {"sp": "10.66.1.0/24"})
    n.vpc("lone", "10.67.0.0/16", {"lo": "10.67.1.0/24"})
    port = cluster.service_address("store")[1]
    n.client.post(f"/v1/security-groups/{hub['default_security_group_id']}/rules",
                  {"direction": "ingress", "protocol": "tcp", "port_range_min": port, "port_range_max": port,
                   "remote_cidr": "10.64.0.0/14"})  # the spoke and the lone VPC alike: routing decides
    pc = n.client.post("/v1/peerings", {"requester_vpc_id": spoke["id"], "accepter_vpc_id": hub["id"]})
    ep = endpoint(n, store)  # after the peering: the endpoint's coming is the news the instance needs
    vm, lone = n.vm("sp", "hv2"), n.vm("lo", "hv1")
    url = f"http://{ep['address']}:{port}"
    wait_for(lambda: http_get(cluster, vm, f"{url}/whoami", 1) == ep["source_address"], 20,
             "the store from the spoke through the hub's endpoint")
    assert http_get(cluster, vm, f"{url}/objects/hello.txt") == "hello from the cluster's object store\n"
    assert http_get(cluster, lone, f"{url}/whoami", 2) is None
    n.client.delete(f"/v1/peerings/{pc['id']}")
    wait_for(lambda: http_get(cluster, vm, f"{url}/whoami", 1) is None, 15, "the way gone with the peering")


def test_svc_deleting_the_endpoint_cuts_the_traffic(cluster, tenants, store) -> None:
    n = tenants()
    n.vpc("prod", "10.64.0.0/16", {"s": "10.64.1.0/24"})
    vm = n.vm("s", "hv3")
    ep = endpoint(n, store)
    url = f"http://{ep['address']}/whoami"
    wait_for(lambda: http_get(cluster, vm, url, 1) is not None, 20, "the store through the endpoint")
    # the store's port unreachable reaches the VM, about its own datagram: its socket says refused
    r = ex(cluster, vm, sys.executable, "-c", REFUSED, ep["address"], str(CLOSED_UDP))
    assert r.stdout.strip() == "refused", r.stdout + r.stderr
    n.client.delete(f"/v1/service-endpoints/{ep['id']}")
    wait_for(lambda: http_get(cluster, vm, url, 1) is None, 10, "the traffic to stop")
    assert http_get(cluster, vm, url, 2) is None


KEEP_ALIVE = r"""
import http.client, sys
h = http.client.HTTPConnection(sys.argv[1], 80, timeout=5)
for _ in range(2):
    h.request("GET", "/whoami")
    print(h.getresponse().read().decode(), flush=True)
    sys.stdin.readline()
"""


def serving(cluster, endpoint_id: str) -> str | None:
    return next((g for g in ("svc1", "svc2") if any(
        e["id"] == endpoint_id for e in cluster.gateway_status(g).get("endpoints_served", []))), None)


def test_svc_a_killed_instance_moves_its_endpoints_and_their_connections_go_on(cluster, tenants, store) -> None:
    """The instance serving an endpoint is killed: the endpoint moves to the other one, and a connection opened
    before the kill carries on through it (the translation is a function of the endpoint and the VM's address and
    port, so the survivor makes the same one)."""
    n = tenants()
    n.vpc("prod", "10.65.0.0/16", {"s": "10.65.1.0/24"})
    vm = n.vm("s", "hv2")
    ep = endpoint(n, store)
    url = f"http://{ep['address']}/whoami"
    wait_for(lambda: http_get(cluster, vm, url, 1) is not None, 20, "the store through the endpoint")
    wait_for(lambda: serving(cluster, ep["id"]), 5, "an instance to report the endpoint")
    home = serving(cluster, ep["id"])
    other = "svc2" if home == "svc1" else "svc1"
    conn = subprocess.Popen(["ip", "netns", "exec", vm["ns"], sys.executable, "-c", KEEP_ALIVE, ep["address"]],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert conn.stdout.readline().strip() == ep["source_address"]
    t0 = time.monotonic()
    cluster.kill_gateway(home)
    try:
        wait_for(lambda: http_get(cluster, vm, url, 1) == ep["source_address"], 10,
                 "a new connection through the surviving instance")
        moved_in = time.monotonic() - t0
        assert serving(cluster, ep["id"]) in (other, None)  # its status file may lag; the traffic does not
        out, _ = conn.communicate("go\n", timeout=20)
        assert out.strip() == ep["source_address"], f"the connection opened before the kill: {out!r}"
        assert moved_in < 10
    finally:
        conn.kill()
        cluster.start_gateway(home)
        cluster.wait_gateways(timeout=30)


def test_svc_a_published_load_balancer_serves_the_tenants_it_names_only(cluster, tenants) -> None:
    """A tenant publishes its load balancer to one other tenant (both use 10.70.0.0/16): the allowed tenant's VM
    reaches the members through its endpoint, and they see the endpoint's own port in their VPC as the client;
    a tenant not named cannot make an endpoint (the service does not exist for it)."""
    import uuid

    from tests.scenarios.lb_support import connect_many, make_lb

    a, b, prov = tenants(), tenants(), tenants()  # consumers first: their endpoints go before the service
    for n in (a, b, prov):
        n.vpc("prod", "10.70.0.0/16", {"s": "10.70.1.0/24"})
    backs = [prov.vm("s", h) for h in ("hv1", "hv2")]
    lb = make_lb(prov, "prod", "s", backs)
    try:
        svc = prov.client.post("/v1/services", {"load_balancer_id": lb.lb["id"], "name": f"web-{uuid.uuid4().hex[:6]}",
                                                "allowed_tenants": [a.vpcs["prod"]["tenant_id"]]})
        vm = a.vm("s", "hv3")
        ep = endpoint(a, svc)
        assert ep["source_address"].startswith("10.70.1.") and ep["source_address"] != lb.vip
        wait_for(lambda: len(connect_many(a, vm, ep["address"], 10, 80, workers=4)[0]) == 2, 30,
                 "both members answering through the endpoint")
        got, seen, fails = connect_many(a, vm, ep["address"], 40, 80, workers=8)
        assert fails == 0 and set(got) == {x["name"] for x in backs}, got
        assert set().union(*seen.values()) == {ep["source_address"]}, seen
        # members under a health monitor still have their VPC's resolver (their punts are not probe answers)
        prov.client.put(f"/v1/pools/{lb.pool['id']}/health-monitor", {"type": "tcp", "interval_s": 1,
                                                                      "timeout_s": 0.5, "rise": 1, "fall": 2})
        wait_for(lambda: all(m["operating_status"] == "ONLINE"
                             for m in prov.client.get(f"/v1/pools/{lb.pool['id']}/members")), 15, "members ONLINE")
        assert resolve(cluster, backs[0], "nothing.prod.internal", "10.70.1.1") == "rcode 3"
        r = b.client.http.post("/v1/service-endpoints", json={"vpc_id": b.vpcs["prod"]["id"],
                                                             "subnet_id": b.subnets["s"]["id"],
                                                             "service_id": svc["id"]})
        assert r.status_code == 404, r.text
    finally:
        lb.stop()


CONNECT = r"""
import socket, sys, time
t0 = time.monotonic()
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
print(f"{time.monotonic() - t0:.4f}")
"""


def tunnel_neighbours(cluster, hv: str, *args: str) -> str:
    """`ovs-appctl tnl/neigh/...` on hypervisor `hv`'s own Open vSwitch."""
    from vswitch_agent.live_trace import appctl_target

    info = cluster.state.hypervisors[hv]
    return subprocess.run(["ip", "netns", "exec", info["ns"], "ovs-appctl", *appctl_target(info["rundir"]),
                           f"tnl/neigh/{args[0]}", *args[1:]], capture_output=True, text=True, check=True).stdout


def test_svc_the_first_connection_to_a_new_endpoint_is_not_a_retransmission(cluster, tenants, store) -> None:
    """Open vSwitch's native tunnelling drops a packet whose underlay next hop it has not resolved yet: the first
    SYN to a new endpoint's instance was lost (a second's retransmission). The agent resolves every VTEP itself,
    again when the cache lets one go: flushed, the cache is filled again without any traffic, and the first
    connection through a new endpoint takes milliseconds."""
    n = tenants()
    n.vpc("prod", "10.66.0.0/16", {"s": "10.66.1.0/24"})
    vm = n.vm("s", "hv3")
    instances = {cluster.state.nodes[g]["underlay_ip"].split("/")[0] for g in ("svc1", "svc2")}
    tunnel_neighbours(cluster, "hv3", "flush")
    assert not instances & set(tunnel_neighbours(cluster, "hv3", "show").split())
    wait_for(lambda: instances <= set(tunnel_neighbours(cluster, "hv3", "show").split()), 40,
             "the service instances' VTEPs resolved again by the agent, without traffic")
    ep = endpoint(n, store)
    cluster.wait_converged()
    # the instance serving it holds it too: what is timed is the packets' way only
    wait_for(lambda: any(ep["id"] in {e["id"] for e in cluster.gateway_status(g).get("endpoints_served", [])}
                         for g in ("svc1", "svc2")), 15, f"an instance serving endpoint {ep['id']}")
    took = float(ex(cluster, vm, sys.executable, "-c", CONNECT, ep["address"], "80").stdout)
    print(f"first connection through a new endpoint: {took * 1000:.1f} ms")
    assert took < 0.1, f"the first connection took {took:.3f} s: its SYN was lost"
