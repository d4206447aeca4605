"""The reachability analyzer against real packets on the emulated cluster: for each case the scenario suite covers
(allowed, denied by a security group, denied by tenant isolation, peering, NAT, a subnet without SNAT), what
`POST /v1/reachability` says is what the VMs' own TCP, ping and HTTP find."""

from __future__ import annotations

import subprocess
import sys

from tests.scenarios.conftest import ex, reach, wait_for
from tests.scenarios.nat_support import curl, gw_ready

LISTEN = """
import socket, threading
def serve(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("%s", port)); s.listen(16)
    while True:
        c, _ = s.accept(); c.close()
for p in %r:
    threading.Thread(target=serve, args=(p,), daemon=True).start()
threading.Event().wait()
"""


def listen(cluster, vm: dict, ports: tuple[int, ...]) -> subprocess.Popen:
    p = subprocess.Popen(["ip", "netns", "exec", vm["ns"], sys.executable, "-c", LISTEN % (vm["ip"], ports)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: all(f"{vm['ip']}:{x}" in ex(cluster, vm, "ss", "-ltn").stdout for x in ports), 5, "listening")
    return p


def tcp_connects(cluster, vm: dict, ip: str, port: int) -> bool:
    """The SYN arrives and its answer returns: a connection, or a refusal (a RST from a closed port)."""
    code = (f"import socket\ntry:\n    socket.create_connection(({ip!r}, {port}), 1)\n"
            "except ConnectionRefusedError:\n    pass")
    return ex(cluster, vm, sys.executable, "-c", code).returncode == 0


LIVE: list[tuple[str, dict]] = []  # every question again as the admin with `live`: the switch's own answer


def verdict(client, src: dict, proto: str, port: int | None = None, **dst: str) -> dict:
    body = {"source_port_id": src["port_id"], "destination": dst, "protocol": proto} | (
        {"port": port} if port else {})
    if LIVE:
        live = LIVE[0][1]["admin"].post("/v1/reachability", body | {"live": True})["live"]
        assert live["agrees"] is True, f"{src['ip']} -> {dst} {proto}/{port}: {live}"
    return client.post("/v1/reachability", body)


def agree(a: dict, real: bool, what: str) -> None:
    said = a["verdict"] == "reachable"
    assert said == real, f"{what}: the analyzer says {a['verdict']} ({a['reason']}), real packets say " \
                         f"{'reachable' if real else 'unreachable'}"


def test_the_analyzer_agrees_with_real_packets(cluster, tenants, internet) -> None:
    """And `live`: for every question, the source hypervisor's Open vSwitch (ofproto/trace through its agent)
    sends the packet where the model does."""
    LIVE[:] = [("cluster", {"admin": cluster.admin})]
    a = tenants()
    vpc = a.vpc("prod", "10.0.0.0/16", {"web": "10.0.1.0/24", "db": "10.0.2.0/24"})
    db = a.client.post("/v1/security-groups", {"vpc_id": vpc["id"], "name": "db", "rules": [
        {"direction": "ingress", "protocol": "tcp", "port_range_min": 5432, "port_range_max": 5432,
         "remote_cidr": "10.0.1.0/24"},
        {"direction": "egress", "protocol": "any"}]})
    cli = a.vm("web", "hv1")
    web2 = a.vm("web", "hv3")
    srv = a.vm("db", "hv2", security_group_ids=[db["id"]])
    # a NAT gateway for the web subnet only
    eip = a.client.post("/v1/eips", {})
    gw = a.client.post("/v1/nat-gateways", {"vpc_id": vpc["id"], "eip_ids": [eip["id"]]})
    a.client.post(f"/v1/nat-gateways/{gw['id']}/snat-rules", {"subnet_id": a.subnets["web"]["id"],
                                                               "eip_ids": [eip["id"]]})
    a.client.post(f"/v1/vpcs/{vpc['id']}/routes", {"destination": "0.0.0.0/0", "target": f"nat-gateway:{gw['id']}"})
    # another tenant: the same address plan, a VM at an address prod does not use; and a peered VPC of prod's
    b = tenants()
    b.vpc("twin", "10.0.0.0/16", {"db": "10.0.2.0/24"})
    twin = b.vm("db", "hv2", ip="10.0.2.77")
    peer_vpc = a.vpc("peer", "10.7.0.0/16", {"p": "10.7.0.0/24"})
    a.client.post(f"/v1/security-groups/{peer_vpc['default_security_group_id']}/rules",
                  {"direction": "ingress", "protocol": "icmp", "remote_cidr": "10.0.0.0/16"})
    pvm = a.vm("p", "hv3")
    a.client.post("/v1/peerings", {"requester_vpc_id": vpc["id"], "accepter_vpc_id": peer_vpc["id"]})
    gw_ready(cluster, [eip["address"]])
    servers = [listen(cluster, srv, (5432, 8080)), listen(cluster, twin, (5432,))]
    try:
        wait_for(lambda: tcp_connects(cluster, cli, srv["ip"], 5432), 8, "allowed TCP")
        agree(verdict(a.client, cli, "tcp", 5432, port_id=srv["port_id"]), True, "allowed by the db group")
        agree(verdict(a.client, cli, "tcp", 8080, ip=srv["ip"]), tcp_connects(cluster, cli, srv["ip"], 8080),
              "a port the db group does not open")
        agree(verdict(a.client, srv, "tcp", 22, ip=cli["ip"]), tcp_connects(cluster, srv, cli["ip"], 22),
              "into the web VM's default group from outside it")
        agree(verdict(a.client, cli, "icmp", ip=web2["ip"]), reach(cluster, cli, web2["ip"]),
              "same group, across hosts")
        agree(verdict(a.client, cli, "tcp", 5432, ip=twin["ip"]), tcp_connects(cluster, cli, twin["ip"], 5432),
              "another tenant's VM at an address of our own plan")
        agree(verdict(b.client, twin, "tcp", 5432, ip=srv["ip"]), tcp_connects(cluster, twin, srv["ip"], 5432),
              "the other tenant towards ours")
        wait_for(lambda: reach(cluster, cli, pvm["ip"], timeout=1), 8, "peering")
        agree(verdict(a.client, cli, "icmp", ip=pvm["ip"]), True, "peering, icmp allowed by the peer's group")
        agree(verdict(a.client, pvm, "icmp", ip=cli["ip"]), reach(cluster, pvm, cli["ip"], timeout=2),
              "back over the peering: the web VM's default group does not let the peer in")
        url = f"http://{internet['ip']}/"
        wait_for(lambda: curl(cluster, cli, url) == eip["address"], 10, "NAT")
        nat = verdict(a.client, cli, "tcp", 80, ip=internet["ip"])
        agree(nat, True, "the web subnet through its NAT gateway")
        assert eip["address"] in nat["reason"] and nat["forward"]["hops"][-1]["role"] == "nat"
        agree(verdict(a.client, srv, "tcp", 80, ip=internet["ip"]), curl(cluster, srv, url) is not None,
              "the db subnet, which has no SNAT rule")
    finally:
        for p in servers:
            p.kill()
