"""EIPs and NAT gateways: allocation, association, rules, validation, tenancy."""

from __future__ import annotations

from tests.api.test_resources import expect, make_vpc
from tests.conftest import Controller


def setup(controller: Controller):  # noqa: ANN201
    controller.admin.post("/v1/eip-pools", {"cidr": "203.0.113.0/29"})
    a = controller.tenant()
    vpc = make_vpc(a)
    sn = a.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.0.1.0/24"})
    port = a.post("/v1/ports", {"subnet_id": sn["id"], "name": "vm"})
    return a, vpc, sn, port


def test_eip_allocation_association_and_exhaustion(controller: Controller) -> None:
    a, vpc, sn, port = setup(controller)
    b = controller.tenant()
    expect(403, a.post, "/v1/eip-pools", {"cidr": "198.51.100.0/24"})
    expect(409, controller.admin.post, "/v1/eip-pools", {"cidr": "203.0.113.0/28"}, field="cidr")
    eips = [a.post("/v1/eips", {}) for _ in range(3)]
    assert [e["address"] for e in eips] == ["203.0.113.1", "203.0.113.2", "203.0.113.3"]
    more = [b.post("/v1/eips", {}) for _ in range(3)]
    assert len({e["address"] for e in eips + more}) == 6
    before = controller.snapshot()
    e = expect(409, b.post, "/v1/eips", {})  # a /29 has 6 usable addresses
    assert "EIP pool" in e.detail
    assert controller.snapshot() == before
    expect(404, b.get, f"/v1/eips/{eips[0]['id']}")
    assert {x["id"] for x in b.get("/v1/eips")} == {x["id"] for x in more}
    assoc = a.post(f"/v1/eips/{eips[0]['id']}/associate", {"port_id": port["id"]})
    assert assoc["port_id"] == port["id"]
    expect(409, a.post, f"/v1/eips/{eips[1]['id']}/associate", {"port_id": port["id"]}, field="port_id")
    expect(404, b.post, f"/v1/eips/{more[0]['id']}/associate", {"port_id": port["id"]}, field="port_id")
    expect(409, a.delete, f"/v1/eips/{eips[0]['id']}")
    a.post(f"/v1/eips/{eips[0]['id']}/disassociate")
    a.delete(f"/v1/eips/{eips[0]['id']}")
    assert a.post("/v1/eips", {})["address"] == "203.0.113.1"  # released addresses return to the pool


def test_nat_gateway_and_rules(controller: Controller) -> None:
    a, vpc, sn, port = setup(controller)
    e1, e2, e3 = (a.post("/v1/eips", {}) for _ in range(3))
    gw = a.post("/v1/nat-gateways", {"vpc_id": vpc["id"], "eip_ids": [e1["id"], e2["id"]]})
    assert gw["eip_ids"] == [e1["id"], e2["id"]] or set(gw["eip_ids"]) == {e1["id"], e2["id"]}
    snat = a.post(f"/v1/nat-gateways/{gw['id']}/snat-rules", {"subnet_id": sn["id"], "eip_ids": [e1["id"]]})
    assert snat["cidr"] == "10.0.1.0/24"
    dnat = a.post(f"/v1/nat-gateways/{gw['id']}/dnat-rules", {"eip_id": e3["id"], "protocol": "tcp",
                                                               "external_port": 8443, "port_id": port["id"],
                                                               "internal_port": 443})
    assert dnat["internal_port"] == 443
    b = controller.tenant()
    before = controller.snapshot()
    bad = [
        (422, f"/v1/nat-gateways/{gw['id']}/snat-rules", {"cidr": "10.0.1.0/24", "subnet_id": sn["id"],
                                                          "eip_ids": [e1["id"]]}, None),
        (422, f"/v1/nat-gateways/{gw['id']}/snat-rules", {"cidr": "192.168.0.0/24", "eip_ids": [e1["id"]]}, "cidr"),
        (422, f"/v1/nat-gateways/{gw['id']}/snat-rules", {"cidr": "10.0.2.0/24", "eip_ids": [e3["id"]]},
         "eip_ids.0"),
        (409, f"/v1/nat-gateways/{gw['id']}/snat-rules", {"cidr": "10.0.1.0/24", "eip_ids": [e1["id"]]}, "cidr"),
        (409, f"/v1/nat-gateways/{gw['id']}/dnat-rules", {"eip_id": e3["id"], "protocol": "tcp",
                                                          "external_port": 8443, "port_id": port["id"],
                                                          "internal_port": 22}, "external_port"),
        (422, f"/v1/nat-gateways/{gw['id']}/dnat-rules", {"eip_id": e3["id"], "protocol": "icmp",
                                                          "external_port": 1, "port_id": port["id"],
                                                          "internal_port": 1}, "protocol"),
        (409, "/v1/nat-gateways", {"vpc_id": vpc["id"], "name": "second", "eip_ids": [e1["id"]]}, "eip_ids.0"),
        (422, "/v1/nat-gateways", {"vpc_id": vpc["id"], "eip_ids": []}, "eip_ids"),
    ]
    for status, path, body, field in bad:
        expect(status, a.post, path, body, field=field)
    expect(404, b.get, f"/v1/nat-gateways/{gw['id']}")
    expect(404, b.post, f"/v1/nat-gateways/{gw['id']}/snat-rules", {"cidr": "10.0.0.0/24", "eip_ids": [e1["id"]]})
    assert controller.snapshot() == before
    expect(409, a.delete, f"/v1/eips/{e1['id']}")  # used by the gateway
    a.delete(f"/v1/nat-gateways/{gw['id']}/dnat-rules/{dnat['id']}")
    a.delete(f"/v1/nat-gateways/{gw['id']}")
    a.delete(f"/v1/eips/{e1['id']}")


def test_nat_gateway_spread_over_instances(controller: Controller) -> None:
    """Several EIPs on several live instances: each instance SNATs with the EIPs it homes and answers ARP only
    for those; the vSwitch route splits the VM addresses into buckets over exactly those instances."""
    a, vpc, sn, _ = setup(controller)
    adm = controller.admin
    hv = {"name": "hv1", "vtep_ip": "172.31.0.11"}
    adm.post("/v1/hosts", hv)
    eips = [a.post("/v1/eips", {}) for _ in range(6)]
    gw = a.post("/v1/nat-gateways", {"vpc_id": vpc["id"], "eip_ids": [e["id"] for e in eips]})
    a.post(f"/v1/nat-gateways/{gw['id']}/snat-rules", {"subnet_id": sn["id"], "eip_ids": [e["id"] for e in eips]})
    a.post(f"/v1/vpcs/{vpc['id']}/routes", {"destination": "0.0.0.0/0", "target": f"nat-gateway:{gw['id']}"})
    a.post("/v1/ports", {"subnet_id": sn["id"], "name": "vm2", "host": "hv1"})
    for i in range(3):  # last: instances that stop heartbeating go down after 2 s
        adm.post("/v1/hosts", {"name": f"gw{i}", "vtep_ip": f"172.31.0.10{i}", "kind": "gateway"})
    cfgs = {f"gw{i}": adm.get(f"/v1/gateways/gw{i}/config") for i in range(3)}
    used = {n: {x for v in c["vpcs"] for r in v["snat"] for x in r["eips"]} for n, c in cfgs.items()}
    # the EIPs are partitioned among the instances, and each answers ARP for its own only
    assert set().union(*used.values()) == {e["address"] for e in eips}
    assert sum(len(u) for u in used.values()) == 6
    assert all(set(c["eips"]) == used[n] for n, c in cfgs.items())
    route = next(r for v in adm.get("/v1/hosts/hv1/config")["vpcs"] for r in v["routes"]
                 if r["target_type"] == "nat-gateway")
    serving = {f"172.31.0.10{i}" for i in range(3) if used[f"gw{i}"]}
    assert len(route["gateway_buckets"]) == 8 and set(route["gateway_buckets"]) == serving
    assert route["gateway_vteps"] == sorted(serving)


def test_host_config_follows_port_groups_and_eips(controller: Controller) -> None:
    """The host's own ports are compiled per host stamp: a port's new groups or EIP must show at once."""
    a, vpc, sn, _ = setup(controller)
    adm = controller.admin
    adm.post("/v1/hosts", {"name": "hv1", "vtep_ip": "172.31.0.11"})
    port = a.post("/v1/ports", {"subnet_id": sn["id"], "name": "vm9", "host": "hv1"})
    cfg = adm.get("/v1/hosts/hv1/config")
    assert [p["security_group_ids"] for p in cfg["ports"]] == [[vpc["default_security_group_id"]]]
    sg = a.post("/v1/security-groups", {"vpc_id": vpc["id"], "name": "web"})
    a.patch(f"/v1/ports/{port['id']}", {"security_group_ids": [sg["id"]]})
    cfg2 = adm.get("/v1/hosts/hv1/config")
    assert cfg2["revision"] > cfg["revision"]
    assert [p["security_group_ids"] for p in cfg2["ports"]] == [[sg["id"]]]
    adm.post("/v1/hosts", {"name": "gwx", "vtep_ip": "172.31.0.109", "kind": "gateway"})
    eip = a.post("/v1/eips", {})
    a.post(f"/v1/eips/{eip['id']}/associate", {"port_id": port["id"]})
    assert adm.get("/v1/hosts/hv1/config")["ports"][0]["eip_home_vtep"] == "172.31.0.109"
    a.post(f"/v1/eips/{eip['id']}/disassociate", {})
    assert adm.get("/v1/hosts/hv1/config")["ports"][0]["eip_home_vtep"] is None
