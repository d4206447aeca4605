"""Edge routing on the emulated cluster: an edge router (FRR, topologies/edge.py) on the external segment with an
internet host behind it that reaches the cloud only through the routes the gateway instances announce (BGP with
BFD, host routes of the addresses each serves). The NAT instances (gw1, gw2) and the load-balancer instances (lb1,
lb2) run with `--edge-local/--edge-peer` for this module, and as before after it.

6. The internet behind the router reaches a NAT gateway's EIP and a port's 1:1 EIP through the instance homing
   each, and a VM reaches it with its NAT gateway's EIP; a load balancer's EIP is announced by both LB instances
   (every one serves it alike) and the router spreads connections over both (ECMP); killing an instance withdraws
   its routes (BFD), and new connections work again within 2 s.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.scenarios.conftest import WEB, wait_for
from tests.scenarios.lb_support import connect_many, make_lb, wait_serving
from tests.scenarios.nat_support import curl, gw_ready, nat_vpc, own_eip_serving_8080, served
from tests.scenarios.test_lb import web_tier
from topologies.edge import CLOUD_ASN, EDGE_ASN, INTERNET_HOST, ROUTER_IP, EdgeRouter, speaker_address

SPEAKERS = {"gw1": 1, "gw2": 2, "lb1": 11, "lb2": 12}


def speaker(g: str) -> str:
    return speaker_address(SPEAKERS[g]).split("/")[0]


def edge_flags(g: str) -> tuple[str, ...]:
    return ("--edge-local", speaker_address(SPEAKERS[g]), "--edge-peer", ROUTER_IP, "--edge-asn", str(CLOUD_ASN),
            "--edge-peer-asn", str(EDGE_ASN))


def restart(cluster, g: str, edge: bool) -> None:
    cluster.kill_gateway(g)
    cluster.start_gateway(g, *(edge_flags(g) if edge else ()))


def established(cluster, g: str) -> bool:
    return cluster.gateway_status(g).get("edge", {}).get("bgp_state") == "Established"


@pytest.fixture(scope="module")
def edge(cluster):
    router = EdgeRouter(cluster.state).start()
    web = subprocess.Popen(["ip", "netns", "exec", router.inet_ns, sys.executable, "-c", WEB % 80],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for g in SPEAKERS:
            restart(cluster, g, edge=True)
        cluster.wait_gateways(timeout=30)
        wait_for(lambda: all(established(cluster, g) for g in SPEAKERS), 30, "every instance's BGP session to the "
                 "edge router established")
        yield router
    finally:
        web.kill()
        for g in SPEAKERS:  # the flat segment's ARP homing alone again, for the modules after this one
            restart(cluster, g, edge=False)
        cluster.wait_gateways(timeout=30)
        router.stop()
        cluster.wait_converged()


def inet_curl(router: EdgeRouter, url: str, timeout: float = 2) -> str:
    return router.inet_exec("curl", "-s", "-m", str(timeout), url).stdout


def test_edge_6a_nat_eips_announced_by_their_home_and_reached_through_the_router(cluster, tenants, edge) -> None:
    n, eip, _ = nat_vpc(tenants)
    vm, out = n.vm("s", "hv1"), n.vm("s", "hv2")  # `out` without a 1:1 EIP goes out with the NAT gateway's
    own = own_eip_serving_8080(n, vm)
    gw_ready(cluster, [eip["address"], own["address"]])
    homes = served(cluster)
    for a in (eip["address"], own["address"]):
        wait_for(lambda a=a: edge.nexthops(a) == {speaker(homes[a])}, 10, f"{a} routed by the edge router to its "
                 f"home {homes[a]}")
    # outbound: the VM's NAT gateway EIP, the instance's way off the segment being the router
    wait_for(lambda: curl(cluster, out, f"http://{INTERNET_HOST}/") == eip["address"], 10,
             "the VM reaching the internet behind the router with its NAT gateway's EIP")
    web = subprocess.Popen(["ip", "netns", "exec", vm["ns"], sys.executable, "-c", WEB % 8080],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:  # inbound: the 1:1 EIP, the VM seeing the internet host's own address
        wait_for(lambda: inet_curl(edge, f"http://{own['address']}:8080/") == INTERNET_HOST, 10,
                 "the internet behind the router reaching the VM's 1:1 EIP")
    finally:
        web.kill()


def test_edge_6b_a_load_balancers_eip_is_spread_over_both_instances(cluster, tenants, edge) -> None:
    n, backends, clients = web_tier(tenants, "10.48.0.0/16")
    eip = n.client.post("/v1/eips", {})
    lb = make_lb(n, "prod", "web", backends, eip_id=eip["id"])
    try:
        wait_serving(n, clients[0], lb.vip, 3)
        wait_for(lambda: edge.nexthops(eip["address"]) == {speaker("lb1"), speaker("lb2")}, 15,
                 "the VIP's EIP announced by both LB instances (ECMP at the router)")
        before = {g: cluster.gateway_status(g)["dataplane"].get("rx_ext", 0) for g in ("lb1", "lb2")}
        got, seen, fails = connect_many(n, None, eip["address"], 300, ns=edge.inet_ns)
        assert fails == 0 and len(got) == 3, f"from the internet behind the router: {got}, {fails} failed"
        assert all(addrs == {INTERNET_HOST} for addrs in seen.values()), seen
        time.sleep(0.6)  # the status files are rewritten every 0.5 s
        took = {g: cluster.gateway_status(g)["dataplane"].get("rx_ext", 0) - before[g] for g in before}
        print(f"300 connections from behind the router: frames in from the internet per instance {took}")
        assert all(v > 300 for v in took.values()), f"the router did not spread the connections: {took}"
    finally:
        lb.stop()


def test_edge_6c_an_instance_killed_withdraws_its_routes_and_new_connections_work_in_2s(cluster, tenants,
                                                                                       edge) -> None:
    n, backends, clients = web_tier(tenants, "10.49.0.0/16")
    eip = n.client.post("/v1/eips", {})
    lb = make_lb(n, "prod", "web", backends, eip_id=eip["id"])
    nat, nat_eip, _ = nat_vpc(tenants, "10.50.0.0/16", "10.50.1.0/24")
    vm = nat.vm("s", "hv2")
    own = own_eip_serving_8080(nat, vm)
    web = subprocess.Popen(["ip", "netns", "exec", vm["ns"], sys.executable, "-c", WEB % 8080],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_serving(n, clients[0], lb.vip, 3)
        gw_ready(cluster, [nat_eip["address"], own["address"]])
        wait_for(lambda: len(edge.nexthops(eip["address"])) == 2, 15, "the VIP's EIP on both LB instances")
        wait_for(lambda: inet_curl(edge, f"http://{own['address']}:8080/") == INTERNET_HOST, 10, "the 1:1 EIP")
        results = {}
        for victim, address, works in (
                ("lb1", eip["address"], lambda: connect_many(n, None, eip["address"], 20, ns=edge.inet_ns,
                                                             workers=4)[2] == 0),
                (served(cluster)[own["address"]], own["address"],
                 lambda: inet_curl(edge, f"http://{own['address']}:8080/", 0.5) == INTERNET_HOST)):
            t0 = time.monotonic()
            cluster.kill_gateway(victim)
            withdrawn = wait_for(lambda v=victim, a=address: speaker(v) not in edge.nexthops(a), 5,
                                 f"the router withdrawing {victim}'s route to {address}", interval=0.02)
            wait_for(works, 10, f"new connections to {address} without {victim}", interval=0.05)
            results[victim] = (round(withdrawn, 2), round(time.monotonic() - t0, 2))
            print(f"{victim} killed: its route to {address} withdrawn after {withdrawn:.2f} s, new connections "
                  f"work after {results[victim][1]:.2f} s")
            cluster.start_gateway(victim, *edge_flags(victim))
            cluster.wait_gateways(timeout=30)
            wait_for(lambda v=victim: established(cluster, v), 30, f"{victim}'s session back")
        for victim, (withdrawn, total) in results.items():
            assert total <= 2.0, f"{victim} killed: new connections took {total} s (route withdrawn in {withdrawn} s)"
    finally:
        web.kill()
        lb.stop()
