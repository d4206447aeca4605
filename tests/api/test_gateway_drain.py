"""Draining a gateway instance (docs/operations.md, Upgrades): the operator takes it out of every placement while
it runs, so its traffic moves before it stops; it stays drained through beats and restarts until undrained."""

from __future__ import annotations

from tests.api.test_private_lines import LINE
from tests.api.test_private_lines import setup as line_setup
from tests.api.test_resources import expect
from tests.conftest import Controller


def nat_route(controller: Controller) -> dict:
    return next(r for v in controller.admin.get("/v1/hosts/hv1/config")["vpcs"] for r in v["routes"]
                if r["target_type"] == "nat-gateway")


def test_a_drained_nat_instance_homes_nothing_and_the_hypervisors_leave_it(controller: Controller) -> None:
    adm = controller.admin
    adm.post("/v1/eip-pools", {"cidr": "203.0.113.0/29"})
    a = controller.tenant()
    vpc = a.post("/v1/vpcs", {"name": "v", "cidr": "10.0.0.0/16"})
    sn = a.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.0.1.0/24"})
    adm.post("/v1/hosts", {"name": "hv1", "vtep_ip": "172.31.0.11"})
    eips = [a.post("/v1/eips", {}) for _ in range(4)]
    gw = a.post("/v1/nat-gateways", {"vpc_id": vpc["id"], "eip_ids": [e["id"] for e in eips]})
    a.post(f"/v1/nat-gateways/{gw['id']}/snat-rules", {"subnet_id": sn["id"], "eip_ids": [e["id"] for e in eips]})
    a.post(f"/v1/vpcs/{vpc['id']}/routes", {"destination": "0.0.0.0/0", "target": f"nat-gateway:{gw['id']}"})
    controller.orchestrator().post("/v1/ports", {"subnet_id": sn["id"], "name": "vm", "host": "hv1"})
    for i in (1, 2):
        adm.post("/v1/hosts", {"name": f"gw{i}", "vtep_ip": f"172.31.0.10{i}", "kind": "gateway"})
    assert set(nat_route(controller)["gateway_vteps"]) == {"172.31.0.101", "172.31.0.102"}

    before = controller.snapshot()
    expect(409, adm.post, "/v1/hosts/hv1/drain", field="name")  # a hypervisor's VMs move by migration
    expect(404, adm.post, "/v1/hosts/nope/drain")
    expect(403, a.post, "/v1/hosts/gw1/drain")
    assert controller.snapshot() == before

    assert adm.post("/v1/hosts/gw1/drain")["status"] == "draining"
    assert nat_route(controller)["gateway_vteps"] == ["172.31.0.102"]
    assert adm.get("/v1/gateways/gw1/config")["eips"] == []
    assert len(adm.get("/v1/gateways/gw2/config")["eips"]) == 4
    assert {e["home"] for e in a.get("/v1/eips")} == {"gw2"}
    hosts = controller.raw(controller.admin_token)  # its beats and a restart's registration keep it drained
    hosts.post("/v1/hosts/gw1/status", json={"ports": {}})
    adm.post("/v1/hosts", {"name": "gw1", "vtep_ip": "172.31.0.101", "kind": "gateway"})
    assert adm.get("/v1/hosts/gw1")["status"] == "draining"
    assert nat_route(controller)["gateway_vteps"] == ["172.31.0.102"]
    assert adm.post("/v1/hosts/gw1/drain")["status"] == "draining"  # again: nothing changes

    assert adm.delete("/v1/hosts/gw1/drain")["status"] == "up"
    assert set(nat_route(controller)["gateway_vteps"]) == {"172.31.0.101", "172.31.0.102"}
    assert adm.get("/v1/gateways/gw1/config")["eips"]


def test_a_drained_line_instance_hands_its_session_to_the_other(controller: Controller) -> None:
    a, vpc, _ = line_setup(controller)
    line = a.post("/v1/private-lines", LINE | {"vpc_id": vpc["id"]})
    first = line["sessions"][0]["instance"]
    other = ({"pl1", "pl2"} - {first}).pop()
    controller.admin.post(f"/v1/hosts/{first}/drain")
    assert a.get(f"/v1/private-lines/{line['id']}")["sessions"][0]["instance"] == other
    assert controller.admin.get(f"/v1/gateways/{first}/config")["lines"] == []
    controller.admin.delete(f"/v1/hosts/{first}/drain")
    assert a.get(f"/v1/private-lines/{line['id']}")["sessions"][0]["instance"] == other  # it stays where it runs
    back = controller.admin.post(f"/v1/private-lines/{line['id']}/rebalance", {})
    assert back["sessions"][0]["instance"] == first
