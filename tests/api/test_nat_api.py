"""EIPs and NAT gateways: allocation, association, rules, validation, tenancy."""

from __future__ import annotations

from tests.api.test_resources import expect, make_vpc
from tests.conftest import Controller


def setup(controller: Controller):
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


def test_a_released_eip_is_handed_out_again_last(controller: Controller) -> None:
    """Servers may hold a released address's old connections in TIME_WAIT (a new tenant's SYNs from the same ports
    would be refused): while other addresses are free, it rests; when none is, the least recently released comes
    back first."""
    a, *_ = setup(controller)
    eips = {e["address"]: e for e in (a.post("/v1/eips", {}) for _ in range(4))}
    for address in ("203.0.113.2", "203.0.113.1"):
        a.delete(f"/v1/eips/{eips[address]['id']}")
    got = [a.post("/v1/eips", {})["address"] for _ in range(4)]
    assert got == ["203.0.113.5", "203.0.113.6", "203.0.113.2", "203.0.113.1"]
    expect(409, a.post, "/v1/eips", {})


def test_an_snat_rule_says_when_no_default_route_reaches_its_gateway(controller: Controller) -> None:
    a, vpc, sn, _ = setup(controller)
    e1 = a.post("/v1/eips", {})
    gw = a.post("/v1/nat-gateways", {"vpc_id": vpc["id"], "eip_ids": [e1["id"]], "name": "out"})
    snat = a.post(f"/v1/nat-gateways/{gw['id']}/snat-rules", {"subnet_id": sn["id"], "eip_ids": [e1["id"]]})
    [w] = snat["warnings"]
    assert "no route 0.0.0.0/0 to NAT gateway out" in w and f"nat-gateway:{gw['id']}" in w, w
    a.post(f"/v1/vpcs/{vpc['id']}/routes", {"destination": "0.0.0.0/0", "target": f"nat-gateway:{gw['id']}"})
    a.delete(f"/v1/nat-gateways/{gw['id']}/snat-rules/{snat['id']}")
    again = a.post(f"/v1/nat-gateways/{gw['id']}/snat-rules", {"subnet_id": sn["id"], "eip_ids": [e1["id"]]})
    assert again["warnings"] == []


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
        (409, f"/v1/nat-gateways/{gw['id']}/dnat-rules", {"eip_id": e1["id"], "protocol": "tcp",  # an SNAT EIP
                                                          "external_port": 2222, "port_id": port["id"],
                                                          "internal_port": 22}, "eip_id"),
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
    controller.orchestrator().post("/v1/ports", {"subnet_id": sn["id"], "name": "vm2", "host": "hv1"})
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
    port = controller.orchestrator().post("/v1/ports", {"subnet_id": sn["id"], "name": "vm9", "host": "hv1"})
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


def test_gateway_watch_answers_only_changes_of_its_own_config(controller: Controller) -> None:
    """An instance long-polling with the digest of its config is not answered for writes that leave it as it is
    (a port in a tenant without NAT), and is answered at once for one that changes it (an SNAT rule)."""
    a, vpc, sn, port = setup(controller)
    controller.admin.post("/v1/hosts", {"name": "gw1", "vtep_ip": "198.18.0.1", "kind": "gateway"})
    e1 = a.post("/v1/eips", {})
    gw = a.post("/v1/nat-gateways", {"vpc_id": vpc["id"], "eip_ids": [e1["id"]]})
    http = controller.raw(controller.admin_token)
    r = http.get("/v1/gateways/gw1/config", params={"after": -1})
    assert r.status_code == 200
    rev, digest = r.json()["revision"], r.headers["X-Tianji-Config-Digest"]
    # unrelated writes: another tenant's VPC and ports
    b = controller.tenant()
    other = make_vpc(b)
    osn = b.post("/v1/subnets", {"vpc_id": other["id"], "name": "s", "cidr": "10.0.1.0/24"})
    b.post("/v1/ports", {"subnet_id": osn["id"], "name": "x"})
    r = http.get("/v1/gateways/gw1/config", params={"after": rev, "digest": digest, "timeout": 1})
    assert r.status_code == 304
    # without the digest the old behaviour holds (any write answers)
    assert http.get("/v1/gateways/gw1/config", params={"after": rev, "timeout": 1}).status_code == 200
    # a write that concerns it
    a.post(f"/v1/nat-gateways/{gw['id']}/snat-rules", {"subnet_id": sn["id"], "eip_ids": [e1["id"]]})
    r = http.get("/v1/gateways/gw1/config", params={"after": rev, "digest": digest, "timeout": 5})
    assert r.status_code == 200 and r.headers["X-Tianji-Config-Digest"] != digest
    assert [s["cidr"] for v in r.json()["vpcs"] for s in v["snat"]] == ["10.0.1.0/24"]
    bad = http.get("/v1/gateways/gw1/config", params={"after": rev, "digest": "not-hex"})
    assert bad.status_code == 422


def test_gateway_delta_watch_sends_the_sections_that_changed(controller: Controller) -> None:
    """The instances' watch form: every section at first, then only the section of the VPC written to; a VPC that
    gets its first NAT gateway wakes a waiting watch; the deltas applied in turn equal the whole config."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from tianji.southbound import GatewayConfig, GatewayConfigDelta, GatewayHeld, apply_gateway_delta

    a, vpc, sn, port = setup(controller)
    controller.admin.post("/v1/hosts", {"name": "gw1", "vtep_ip": "198.18.0.1", "kind": "gateway"})
    # gw1 beats as a live instance does: on a slow machine the test outlasts the gateways' down-after (2 s), and a
    # gateway marked down moves the topology between a delta and the whole config it is compared with
    import threading

    alive = threading.Event()
    beats = controller.raw(controller.admin_token)
    threading.Thread(target=lambda: [beats.post("/v1/hosts/gw1/status", json={"ports": {}})
                                     for _ in iter(lambda: alive.wait(0.2), True)], daemon=True).start()
    e1 = a.post("/v1/eips", {})
    gw = a.post("/v1/nat-gateways", {"vpc_id": vpc["id"], "eip_ids": [e1["id"]]})
    a.post(f"/v1/nat-gateways/{gw['id']}/snat-rules", {"subnet_id": sn["id"], "eip_ids": [e1["id"]]})
    http = controller.raw(controller.admin_token)
    held = GatewayHeld()

    def poll(timeout: float = 5) -> tuple[set[str], str]:
        """Apply the next answer; (VPCs whose section it changed, the digest)."""
        nonlocal held
        r = http.get("/v1/gateways/gw1/config/delta", params={"after": held.revision, "digest": digest,
                                                              "timeout": timeout})
        assert r.status_code == 200, r.text
        d = GatewayConfigDelta.model_validate(r.json())
        out = apply_gateway_delta(held, d)
        assert out is not None
        held, changed = out
        whole = GatewayConfig.model_validate(http.get("/v1/gateways/gw1/config").json())
        assert held.config().model_copy(update={"name": "gw1"}) == whole
        return changed, r.headers["X-Tianji-Config-Digest"]

    digest = ""
    changed, digest = poll()
    assert changed == {vpc["id"]} and held.sections[vpc["id"]].vpc.snat[0].eips == [e1["address"]]
    # another tenant with NAT: its first NAT gateway wakes the waiting watch, and only its section comes
    b = controller.tenant()
    other = make_vpc(b)
    osn = b.post("/v1/subnets", {"vpc_id": other["id"], "name": "s", "cidr": "10.0.1.0/24"})
    b.post("/v1/ports", {"subnet_id": osn["id"], "name": "x"})
    e2 = b.post("/v1/eips", {})
    with ThreadPoolExecutor(1) as ex:
        waiting = ex.submit(poll, 10)
        time.sleep(0.5)
        b.post("/v1/nat-gateways", {"vpc_id": other["id"], "eip_ids": [e2["id"]]})
        changed, digest = waiting.result()
    assert changed == {other["id"]}
    r = http.get("/v1/gateways/gw1/config/delta", params={"after": held.revision, "digest": digest})
    assert r.status_code == 304, r.text  # nothing more for it
    # a port bound in the first VPC: its section alone, with the new endpoint (an unbound one is none)
    a.post("/v1/ports", {"subnet_id": sn["id"], "name": "unbound"})
    r = http.get("/v1/gateways/gw1/config/delta", params={"after": held.revision, "digest": digest, "timeout": 1})
    assert r.status_code == 304, r.text
    controller.admin.post("/v1/hosts", {"name": "hv1", "vtep_ip": "198.18.1.1"})
    changed, digest = poll()  # a new host: every section again (VTEPs), none of them different
    assert changed == set()
    p2 = controller.orchestrator().post("/v1/ports", {"subnet_id": sn["id"], "name": "vm2", "host": "hv1"})
    r = http.get("/v1/gateways/gw1/config/delta", params={"after": held.revision, "digest": digest, "timeout": 5})
    assert [x["vpc"]["id"] for x in r.json()["sections"]] == [vpc["id"]]
    changed, digest = poll()
    assert changed == {vpc["id"]} and p2["ip"] in {e.ip for e in held.sections[vpc["id"]].endpoints}
    # the NAT gateway deleted: the section goes
    b.delete(f"/v1/nat-gateways/{b.get('/v1/nat-gateways')[0]['id']}")
    changed, digest = poll()
    assert changed == {other["id"]} and other["id"] not in held.sections
    alive.set()
