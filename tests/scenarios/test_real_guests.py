"""Real KVM guests in tenant VPCs (QEMU with its own Linux kernel, a virtio-net NIC on a tap plugged into br-int by
iface-id, as libvirt and Nova plug one): the guest's own DHCP client takes its address, MTU, routes and resolver
from the switch; it reaches a namespace VM on another hypervisor and is reached by it (ICMP and TCP, both ways);
its security groups allow and deny as written; it reaches the internet host through the VPC's NAT gateway, is a
load balancer's member, and resolves a service endpoint's name by the DHCP-given resolver and fetches from the
cluster's object store through it.

One guest serves the module's tests (a boot under TCG takes seconds); each test restores what it changed.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest

from tests.scenarios.conftest import GUEST_WEB, WEB, Net, cleanup, ex, internet, ping, reach, wait_for  # noqa: F401
from tests.scenarios.nat_support import behind_nat, curl
from tests.scenarios.test_services import store  # noqa: F401 -- the fixture


@pytest.fixture(scope="module")
def world(cluster):
    """A tenant with a VPC behind a NAT gateway; a KVM guest on hv1 and a namespace VM on hv2."""
    t = cluster.admin.post("/v1/tenants", {"name": f"t-{uuid.uuid4().hex[:8]}"})
    n = Net(cluster, cluster.client(t["token"]))
    try:
        vpc, eip, _ = behind_nat(n, "10.70.0.0/16", "10.70.1.0/24")
        sg = vpc["default_security_group_id"]
        n.client.post(f"/v1/security-groups/{sg}/rules", {"direction": "ingress", "protocol": "tcp",
                                                          "port_range_min": 8080, "port_range_max": 8081,
                                                          "remote_cidr": "10.70.0.0/16"})
        guest = n.vm("s", "hv1", kind="kvm")
        vm = n.vm("s", "hv2", dhcp=True)
        yield {"net": n, "guest": guest, "vm": vm, "eip": eip, "sg": sg, "vpc": vpc}
    finally:
        cleanup(n)


def g(cluster, world, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return ex(cluster, world["guest"], *cmd, timeout=timeout)


def test_kvm_guest_takes_address_mtu_routes_and_resolver_by_its_own_dhcp(cluster, world) -> None:
    guest, port = world["guest"], world["guest"]["port"]
    assert guest["dhcp_ip"] == port["ip"]
    addr = g(cluster, world, "ip", "-o", "-4", "addr", "show", "dev", "eth0").stdout
    assert f"{port['ip']}/24" in addr, addr
    link = g(cluster, world, "ip", "-o", "link", "show", "dev", "eth0").stdout
    assert "mtu 1450" in link and port["mac"] in link, link  # the VPC's MTU, by DHCP option 26
    route = g(cluster, world, "ip", "route").stdout
    assert "default via 10.70.1.1" in route, route
    resolv = g(cluster, world, "cat", "/etc/resolv.conf").stdout
    assert "nameserver" in resolv, resolv
    assert cluster.state.vms[guest["name"]]["accel"] in ("kvm", "tcg")
    status = cluster.admin.get(f"/v1/ports/{port['id']}")["status"]
    assert status == "UP", status


def test_kvm_guest_and_a_namespace_vm_on_another_host_reach_each_other(cluster, world) -> None:
    guest, vm = world["guest"], world["vm"]
    assert reach(cluster, guest, vm["ip"], timeout=10), "guest -> namespace VM (ICMP)"
    assert ping(cluster, vm, guest["ip"]), "namespace VM -> guest (ICMP)"
    # TCP both ways: the guest's busybox httpd, and the namespace VM's Python server
    assert g(cluster, world, "sh", "-c", GUEST_WEB.format(name=guest["name"], port=8080)).returncode == 0
    assert curl(cluster, vm, f"http://{guest['ip']}:8080/index.html", timeout=5).strip() == guest["name"]
    srv = subprocess.Popen(["ip", "netns", "exec", vm["ns"], sys.executable, "-c", WEB % 8080],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: g(cluster, world, "fetch", f"http://{vm['ip']}:8080/").stdout.strip() == guest["ip"], 15,
                 "the guest fetching from the namespace VM")
        # 300 KB in one connection: segments at the MTU, checksums right through the tap (vnet_hdr off)
        sink = subprocess.Popen(["ip", "netns", "exec", vm["ns"], "sh", "-c", "nc -l 9000 | wc -c"],
                                stdout=subprocess.PIPE, text=True)
        wait_for(lambda: g(cluster, world, "sh", "-c", f"dd if=/dev/zero bs=1k count=300 2>/dev/null | "
                                                      f"nc -w 3 {vm['ip']} 9000").returncode == 0, 10, "nc sending")
        assert sink.communicate(timeout=20)[0].strip() == str(300 * 1024)
    finally:
        srv.kill()
        srv.wait()


def test_kvm_guest_security_groups_allow_and_deny_as_written(cluster, world) -> None:
    n, guest, vm = world["net"], world["guest"], world["vm"]
    g(cluster, world, "sh", "-c", GUEST_WEB.format(name="allowed", port=8080) + "; " +
      GUEST_WEB.format(name="denied", port=8082).replace("/tmp/www", "/tmp/www2"))
    # rules given: exactly those (without, a new group allows all egress)
    web = n.client.post("/v1/security-groups", {"vpc_id": world["vpc"]["id"], "name": "web-only", "rules": []})
    n.client.post(f"/v1/security-groups/{web['id']}/rules", {"direction": "ingress", "protocol": "tcp",
                                                             "port_range_min": 8080, "port_range_max": 8080,
                                                             "remote_cidr": "10.70.0.0/16"})
    pid = guest["port"]["id"]
    n.client.patch(f"/v1/ports/{pid}", {"security_group_ids": [web["id"]]})
    try:
        wait_for(lambda: not ping(cluster, vm, guest["ip"], count=1), 10, "ICMP denied by the new group")
        assert curl(cluster, vm, f"http://{guest['ip']}:8080/index.html", timeout=3).strip() == "allowed"
        assert curl(cluster, vm, f"http://{guest['ip']}:8082/index.html", timeout=2) is None, "8082 is not allowed"
        # no egress rule in the group: nothing goes out; with one, the guest's connection to the VM's 8081 (which
        # the VM's group admits) gets its answers, though nothing from 8081 may come in to the guest (conntrack)
        srv = subprocess.Popen(["ip", "netns", "exec", vm["ns"], sys.executable, "-c", WEB % 8081],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            assert g(cluster, world, "fetch", f"http://{vm['ip']}:8081/").returncode != 0
            n.client.post(f"/v1/security-groups/{web['id']}/rules", {"direction": "egress", "protocol": "any",
                                                                     "remote_cidr": "0.0.0.0/0"})
            wait_for(lambda: g(cluster, world, "fetch", f"http://{vm['ip']}:8081/").stdout.strip() == guest["ip"],
                     10, "the guest's connection out, answered")
        finally:
            srv.kill()
            srv.wait()
    finally:
        n.client.patch(f"/v1/ports/{pid}", {"security_group_ids": [world["sg"]]})
        n.client.delete(f"/v1/security-groups/{web['id']}")
    wait_for(lambda: ping(cluster, vm, guest["ip"], count=1), 10, "ICMP allowed again")


def test_kvm_guest_reaches_the_internet_through_the_nat_gateway(cluster, world, internet) -> None:  # noqa: F811
    url = f"http://{internet['ip']}/"
    wait_for(lambda: g(cluster, world, "fetch", url).stdout.strip() == world["eip"]["address"], 20,
             "the guest's fetch from the internet host, seen from the EIP")


def test_kvm_guest_is_a_load_balancer_member(cluster, world) -> None:
    n, guest, vm = world["net"], world["guest"], world["vm"]
    g(cluster, world, "sh", "-c", GUEST_WEB.format(name=guest["name"], port=8080))
    lb = n.client.post("/v1/load-balancers", {"name": "web", "vpc_id": world["vpc"]["id"],
                                              "subnet_id": n.subnets["s"]["id"]})
    try:
        pool = n.client.post("/v1/pools", {"load_balancer_id": lb["id"], "name": "web", "protocol": "tcp"})
        n.client.post(f"/v1/load-balancers/{lb['id']}/listeners", {"protocol": "tcp", "port": 80,
                                                                   "default_pool_id": pool["id"]})
        n.client.post(f"/v1/pools/{pool['id']}/members", {"port_id": guest["port"]["id"], "protocol_port": 8080})
        url = f"http://{lb['vip_address']}/index.html"
        wait_for(lambda: (curl(cluster, vm, url, timeout=2) or "").strip() == guest["name"], 30,
                 "the VIP answered by the guest")
    finally:
        n.client.delete(f"/v1/load-balancers/{lb['id']}")


def test_kvm_guest_resolves_an_endpoint_by_the_dhcp_resolver_and_fetches_from_the_store(cluster, world,
                                                                                        store) -> None:  # noqa: F811
    n = world["net"]
    ep = n.client.post("/v1/service-endpoints", {"vpc_id": world["vpc"]["id"], "subnet_id": n.subnets["s"]["id"],
                                                 "service_id": store["id"]})
    try:
        def resolved() -> bool:
            out = g(cluster, world, "nslookup", ep["dns_name"]).stdout
            return ep["address"] in out.split("Name:", 1)[-1]

        wait_for(resolved, 20, f"{ep['dns_name']} resolved by the guest's DHCP-given resolver")
        body = g(cluster, world, "fetch", f"http://{ep['dns_name']}/objects/hello.txt")  # name by the guest's DNS
        assert body.stdout.strip() == "hello from the cluster's object store", body
    finally:
        n.client.delete(f"/v1/service-endpoints/{ep['id']}")
