"""vhost-user guests on an OVS-DPDK hypervisor: hv3's ovs-vswitchd is replaced by Debian's DPDK build (hugepages, no
PCI, a poll-mode thread), and a KVM guest is plugged as os-vif plugs one there: a `dpdkvhostuserclient` port named
by iface-id, the guest's memory shared with the switch. The same agent and pipeline serve it: the guest's own DHCP
client gets its address, it reaches a tap guest on hv1 through the tunnel and a namespace VM beside it on the DPDK
switch (ICMP and TCP, both ways), its security groups hold (conntrack on the DPDK datapath), another tenant's VM
with the same address stays out of reach, and it goes out through the VPC's NAT gateway.

The module puts hv3 back on the plain userspace datapath when it ends.
"""

from __future__ import annotations

import subprocess
import uuid

import pytest

from tests.scenarios.conftest import GUEST_WEB, Net, cleanup, ex, internet, ping, reach, wait_for  # noqa: F401
from tests.scenarios.nat_support import behind_nat, curl
from topologies import dpdk_host


@pytest.fixture(scope="module")
def world(cluster):
    """hv3 on OVS-DPDK; a tenant's VPC behind a NAT gateway with a vhost-user guest and a namespace VM on hv3 and
    a tap guest on hv1; a second tenant's VM on hv3 with the vhost-user guest's neighbour's address."""
    dpdk_host.enable(cluster, "hv3", progress=lambda m: None)
    made: list[Net] = []
    try:
        for _ in range(2):
            t = cluster.admin.post("/v1/tenants", {"name": f"t-{uuid.uuid4().hex[:8]}"})
            made.append(Net(cluster, cluster.client(t["token"])))
        n, other = made
        vpc, eip, _ = behind_nat(n, "10.71.0.0/16", "10.71.1.0/24")
        sg = vpc["default_security_group_id"]
        n.client.post(f"/v1/security-groups/{sg}/rules", {"direction": "ingress", "protocol": "tcp",
                                                          "port_range_min": 8080, "port_range_max": 8081,
                                                          "remote_cidr": "10.71.0.0/16"})
        guest = n.vm("s", "hv3", kind="kvm", nic="vhost-user")
        tap_guest = n.vm("s", "hv1", kind="kvm")
        local = n.vm("s", "hv3", ip="10.71.1.50")
        other.vpc("theirs", "10.71.0.0/16", {"s": "10.71.1.0/24"})
        stranger = other.vm("s", "hv3", ip="10.71.1.60")
        yield {"net": n, "guest": guest, "tap_guest": tap_guest, "local": local, "stranger": stranger,
               "eip": eip, "sg": sg, "vpc": vpc}
    finally:
        for n in made:
            cleanup(n)
        dpdk_host.disable(cluster, "hv3", progress=lambda m: None)


def g(cluster, guest: dict, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return ex(cluster, guest, *cmd, timeout=timeout)


def test_the_guest_is_on_a_vhost_user_port_of_ovs_dpdk_and_takes_its_address_by_dhcp(cluster, world) -> None:
    guest, port = world["guest"], world["guest"]["port"]
    hv = cluster.hypervisor("hv3")
    assert hv.vsctl("get", "Open_vSwitch", ".", "dpdk_initialized").strip() == "true"
    assert hv.vsctl("get", "Interface", guest["tap"], "type").strip() == "dpdkvhostuserclient"
    status = hv.vsctl("get", "Interface", guest["tap"], "status")
    assert "status=connected" in status and "mode=client" in status, status
    assert hv.vsctl("get", "Interface", guest["tap"], "external_ids:iface-id").strip().strip('"') == port["id"]
    assert guest["dhcp_ip"] == port["ip"]
    link = g(cluster, guest, "ip", "-o", "link", "show", "dev", "eth0").stdout
    assert "mtu 1450" in link and port["mac"] in link, link
    assert "default via 10.71.1.1" in g(cluster, guest, "ip", "route").stdout
    wait_for(lambda: cluster.admin.get(f"/v1/ports/{port['id']}")["status"] == "UP", 10, "the port UP")


def test_the_guest_reaches_a_tap_guest_on_another_host_and_a_vm_beside_it(cluster, world) -> None:
    guest, tap_guest, local = world["guest"], world["tap_guest"], world["local"]
    assert reach(cluster, guest, tap_guest["ip"], timeout=10), "vhost-user guest -> tap guest on hv1 (tunnel)"
    assert reach(cluster, tap_guest, guest["ip"], timeout=10), "tap guest on hv1 -> vhost-user guest"
    assert reach(cluster, guest, local["ip"], timeout=10), "vhost-user guest -> namespace VM on the DPDK switch"
    assert ping(cluster, local, guest["ip"]), "namespace VM -> vhost-user guest"
    # TCP both ways across the tunnel: 300 KB from the vhost-user guest, then the tap guest's fetch from it
    g(cluster, tap_guest, "sh", "-c", "rm -f /tmp/rx; (sleep 60 | nc -l -p 9000 | wc -c > /tmp/rx) "
                                      ">/dev/null 2>&1 &")
    wait_for(lambda: g(cluster, guest, "sh", "-c", f"dd if=/dev/zero bs=1k count=300 2>/dev/null | "
                                                   f"nc -w 3 {tap_guest['ip']} 9000").returncode == 0, 15,
             "the vhost-user guest sending")
    wait_for(lambda: g(cluster, tap_guest, "cat", "/tmp/rx").stdout.strip() == str(300 * 1024), 15,
             "300 KB at the tap guest")
    assert g(cluster, guest, "sh", "-c", GUEST_WEB.format(name=guest["name"], port=8080)).returncode == 0
    wait_for(lambda: g(cluster, tap_guest, "fetch", f"http://{guest['ip']}:8080/index.html").stdout.strip()
             == guest["name"], 15, "the tap guest fetching from the vhost-user guest")
    assert curl(cluster, local, f"http://{guest['ip']}:8080/index.html", timeout=5).strip() == guest["name"]


def test_the_guests_security_groups_hold_on_the_dpdk_datapath(cluster, world) -> None:
    n, guest, local = world["net"], world["guest"], world["local"]
    g(cluster, guest, "sh", "-c", GUEST_WEB.format(name="allowed", port=8080) + "; " +
      GUEST_WEB.format(name="denied", port=8082).replace("/tmp/www", "/tmp/www2"))
    web = n.client.post("/v1/security-groups", {"vpc_id": world["vpc"]["id"], "name": "web-only"})
    n.client.post(f"/v1/security-groups/{web['id']}/rules", {"direction": "ingress", "protocol": "tcp",
                                                             "port_range_min": 8080, "port_range_max": 8080,
                                                             "remote_cidr": "10.71.0.0/16"})
    pid = guest["port"]["id"]
    n.client.patch(f"/v1/ports/{pid}", {"security_group_ids": [web["id"]]})
    try:
        wait_for(lambda: not ping(cluster, local, guest["ip"], count=1), 10, "ICMP denied by the new group")
        assert curl(cluster, local, f"http://{guest['ip']}:8080/index.html", timeout=3).strip() == "allowed"
        assert curl(cluster, local, f"http://{guest['ip']}:8082/index.html", timeout=2) is None, "8082 denied"
    finally:
        n.client.patch(f"/v1/ports/{pid}", {"security_group_ids": [world["sg"]]})
        n.client.delete(f"/v1/security-groups/{web['id']}")
    wait_for(lambda: ping(cluster, local, guest["ip"], count=1), 10, "ICMP allowed again")


def test_another_tenants_vm_on_the_same_dpdk_switch_stays_out_of_reach(cluster, world) -> None:
    guest, stranger = world["guest"], world["stranger"]
    # the stranger's VPC has the same CIDR: its VM's address is, in the guest's VPC, nobody's
    assert not reach(cluster, guest, stranger["ip"], timeout=3), "the guest reached another tenant's VM"
    assert not ping(cluster, stranger, guest["ip"], count=2), "another tenant's VM reached the guest"


def test_the_guest_goes_out_through_the_nat_gateway(cluster, world, internet) -> None:  # noqa: F811
    url = f"http://{internet['ip']}/"
    wait_for(lambda: g(cluster, world["guest"], "fetch", url).stdout.strip() == world["eip"]["address"], 20,
             "the vhost-user guest's fetch from the internet host, seen from the EIP")
