"""What the NAT scenarios share: the internet's servers, a VPC behind a NAT gateway, and waits on the instances."""

from __future__ import annotations

import subprocess
from collections import Counter

from tests.scenarios.conftest import Net, ex, wait_for


def nat_vpc(tenants, cidr: str = "10.0.0.0/16", subnet: str = "10.0.1.0/24", **vpc_kw) -> tuple[Net, dict, dict]:
    n = tenants()
    _, eip, gw = behind_nat(n, cidr, subnet, **vpc_kw)
    return n, eip, gw


def behind_nat(n: Net, cidr: str, subnet: str, **vpc_kw) -> tuple[dict, dict, dict]:
    """`n`'s VPC "prod" with subnet "s", its internet through a NAT gateway with one EIP: (VPC, EIP, gateway)."""
    vpc = n.vpc("prod", cidr, {"s": subnet}, **vpc_kw)
    eip = n.client.post("/v1/eips", {})
    gw = n.client.post("/v1/nat-gateways", {"vpc_id": vpc["id"], "eip_ids": [eip["id"]]})
    n.client.post(f"/v1/nat-gateways/{gw['id']}/snat-rules",
                  {"subnet_id": n.subnets["s"]["id"], "eip_ids": [eip["id"]]})
    n.client.post(f"/v1/vpcs/{vpc['id']}/routes", {"destination": "0.0.0.0/0", "target": f"nat-gateway:{gw['id']}"})
    return vpc, eip, gw


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


def nat_counters(cluster) -> Counter[str]:
    """Both instances' NAT counters, summed (a VPC's flows may meet either)."""
    return sum((Counter(cluster.gateway_status(g)["nat"]) for g in ("gw1", "gw2")), Counter())
