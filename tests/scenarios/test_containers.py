"""podman containers in tenant VPCs through tianji-cni, as a container host runs them (`podman run --network`
with a conflist naming the controller, an orchestrator token, the subnet and the host): a container reaches a KVM
guest on another hypervisor in a peered VPC and is reached by it (ICMP, TCP), and `podman rm` removes its port
and every flow of it."""

from __future__ import annotations

from tests.scenarios.conftest import ex, ping, reach, wait_for


def test_a_container_reaches_a_kvm_guest_in_a_peered_vpc_and_back(cluster, tenants) -> None:
    n = tenants()
    one = n.vpc("one", "10.72.0.0/16", {"s1": "10.72.1.0/24"})
    two = n.vpc("two", "10.73.0.0/16", {"s2": "10.73.1.0/24"})
    for vpc in (one, two):  # default groups admit only members: ICMP and TCP 8080 across the tenant's VPCs
        sg = vpc["default_security_group_id"]
        n.client.post(f"/v1/security-groups/{sg}/rules", {"direction": "ingress", "protocol": "icmp",
                                                          "remote_cidr": "10.0.0.0/8"})
        n.client.post(f"/v1/security-groups/{sg}/rules", {"direction": "ingress", "protocol": "tcp",
                                                          "port_range_min": 8080, "port_range_max": 8080,
                                                          "remote_cidr": "10.0.0.0/8"})
    guest = n.vm("s2", "hv1", kind="kvm")
    box = n.container("s1", "hv3")
    assert box["port"]["host"] == "hv3" and box["port"]["status"] == "UP"
    assert not ping(cluster, box, guest["ip"], count=1), "reached a VPC it is not peered with"
    n.client.post("/v1/peerings", {"requester_vpc_id": one["id"], "accepter_vpc_id": two["id"]})
    cluster.wait_converged()
    assert reach(cluster, box, guest["ip"], timeout=10), "container -> KVM guest in the peered VPC"
    assert ping(cluster, guest, box["ip"], count=2), "KVM guest -> container"
    ex(cluster, guest, "sh", "-c", "mkdir -p /tmp/w && echo guest > /tmp/w/i && httpd -p 8080 -h /tmp/w")
    assert ex(cluster, box, "fetch", f"http://{guest['ip']}:8080/i").stdout.strip() == "guest"
    ex(cluster, box, "sh", "-c", "mkdir -p /tmp/w && echo box > /tmp/w/i && httpd -p 8080 -h /tmp/w")
    assert ex(cluster, guest, "fetch", f"http://{box['ip']}:8080/i").stdout.strip() == "box"


def test_removing_the_container_removes_its_port_and_flows(cluster, tenants) -> None:
    n = tenants()
    n.vpc("prod", "10.74.0.0/16", {"s": "10.74.1.0/24"})
    box = n.container("s", "hv2")
    hv = cluster.hypervisor("hv2")
    assert box["port"]["mac"] in hv.ofctl("dump-flows", "br-int")
    cluster.vm_remove(box["name"])  # podman rm: the plugin's DEL
    assert [p for p in n.client.get("/v1/ports") if p["id"] == box["port_id"]] == []
    wait_for(lambda: box["port"]["mac"] not in hv.ofctl("dump-flows", "br-int")
             and f"tc{box['port_id'][:11]}" not in hv.vsctl("list-ports", "br-int"), 10,
             "the container's flows and bridge port gone")
