"""Services outside every VPC, reached through endpoints (issue: the VPC gateway to the cluster's services). What
runs today: the VPC's resolver. A VM that took its address by DHCP finds the resolver DHCP named (its subnet's
gateway, answered by the agent) in its own resolv.conf, and resolves its VPC's endpoint names there; another
tenant's VM on the same hypervisor, with the same addresses, does not resolve them; a deleted endpoint's name is
gone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.scenarios.conftest import ex, wait_for

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


@pytest.fixture
def store(cluster):
    svc = cluster.admin.post("/v1/services", {"name": "store", "addresses": ["100.100.0.10"],
                                              "ports": [{"protocol": "tcp", "port": 80}]})
    yield svc
    for e in cluster.admin.get("/v1/service-endpoints"):
        if e["service_id"] == svc["id"]:
            cluster.admin.delete(f"/v1/service-endpoints/{e['id']}")
    cluster.admin.delete(f"/v1/services/{svc['id']}")


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
