"""API behaviour of every resource, on SQLite and PostgreSQL."""

from __future__ import annotations

import ipaddress

import pytest

from tests.conftest import Controller
from tianji.api_client import ApiFailure


def expect(status: int, fn, *args, field: str | None = None):
    with pytest.raises(ApiFailure) as ei:
        fn(*args)
    assert ei.value.status == status, ei.value
    if field is not None:
        assert ei.value.field == field, ei.value.body
    return ei.value


def make_vpc(c, name="v1", cidr="10.0.0.0/16"):
    return c.post("/v1/vpcs", {"name": name, "cidr": cidr})


def test_tenant_vpc_subnet_port_lifecycle(controller: Controller) -> None:
    a = controller.tenant("acme")
    controller.admin.post("/v1/hosts", {"name": "hv1", "vtep_ip": "172.31.0.1"})
    vpc = make_vpc(a)
    assert vpc["vni"] >= 1000 and vpc["tenant_id"] == a.tenant_id and vpc["default_security_group_id"]
    sn = a.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "web", "cidr": "10.0.1.0/24"})
    assert sn["gateway_ip"] == "10.0.1.1" and sn["available_ips"] == 253
    p1 = a.post("/v1/ports", {"subnet_id": sn["id"], "name": "vm1"})
    assert p1["ip"] == "10.0.1.2" and p1["status"] == "DOWN" and p1["host"] is None
    assert p1["security_group_ids"] == [vpc["default_security_group_id"]]
    first = int(p1["mac"].split(":")[0], 16)
    assert first & 0x02 and not first & 0x01  # locally administered unicast
    p2 = controller.orchestrator().post("/v1/ports", {"subnet_id": sn["id"], "name": "vm2", "ip": "10.0.1.50",
                                                      "mac": "02:00:00:00:00:50", "host": "hv1"})
    assert (p2["ip"], p2["mac"], p2["host"]) == ("10.0.1.50", "02:00:00:00:00:50", "hv1")
    p3 = a.post("/v1/ports", {"subnet_id": sn["id"], "name": "vm3"})
    assert p3["ip"] == "10.0.1.51"  # above the highest allocated
    moved = controller.orchestrator().patch(f"/v1/ports/{p1['id']}", {"host": "hv1"})
    assert moved["host"] == "hv1"
    assert {p["name"] for p in a.get("/v1/ports", vpc_id=vpc["id"])} == {"vm1", "vm2", "vm3"}
    assert a.get(f"/v1/subnets/{sn['id']}")["available_ips"] == 250
    expect(409, a.delete, f"/v1/vpcs/{vpc['id']}")
    expect(409, a.delete, f"/v1/subnets/{sn['id']}")
    for p in (p1, p2, p3):
        a.delete(f"/v1/ports/{p['id']}")
    a.delete(f"/v1/subnets/{sn['id']}")
    a.delete(f"/v1/vpcs/{vpc['id']}")
    assert a.get("/v1/vpcs") == []


def test_tenants_are_isolated(controller: Controller) -> None:
    a, b = controller.tenant(), controller.tenant()
    va = make_vpc(a, "same", "10.0.0.0/16")
    vb = make_vpc(b, "same", "10.0.0.0/16")  # same name and CIDR in another tenant: fine
    assert va["vni"] != vb["vni"]
    sa = a.post("/v1/subnets", {"vpc_id": va["id"], "name": "s", "cidr": "10.0.0.0/24"})
    pa = a.post("/v1/ports", {"subnet_id": sa["id"], "name": "p", "ip": "10.0.0.10"})
    sb = b.post("/v1/subnets", {"vpc_id": vb["id"], "name": "s", "cidr": "10.0.0.0/24"})
    pb = b.post("/v1/ports", {"subnet_id": sb["id"], "name": "p", "ip": "10.0.0.10"})  # identical IP: fine
    assert pa["mac"] != pb["mac"]
    assert [v["id"] for v in b.get("/v1/vpcs")] == [vb["id"]]
    for path in (f"/v1/vpcs/{va['id']}", f"/v1/subnets/{sa['id']}", f"/v1/ports/{pa['id']}",
                 f"/v1/security-groups/{va['default_security_group_id']}", f"/v1/vpcs/{va['id']}/routes"):
        expect(404, b.get, path)
    before = controller.snapshot()
    expect(404, b.delete, f"/v1/ports/{pa['id']}")
    expect(404, b.delete, f"/v1/vpcs/{va['id']}")
    expect(404, b.patch, f"/v1/ports/{pa['id']}", {"name": "stolen"})
    expect(404, b.post, "/v1/ports", {"subnet_id": sa["id"], "name": "x"}, field="subnet_id")
    expect(404, b.post, "/v1/subnets", {"vpc_id": va["id"], "name": "x", "cidr": "10.0.9.0/24"}, field="vpc_id")
    expect(404, b.post, "/v1/ports", {"subnet_id": sb["id"], "name": "x",
                                      "security_group_ids": [va["default_security_group_id"]]},
           field="security_group_ids.0")
    assert controller.snapshot() == before
    # tenants cannot manage tenants or hosts
    expect(403, a.post, "/v1/tenants", {"name": "evil"})
    expect(403, a.get, "/v1/hosts")
    expect(403, a.get, "/v1/hosts/hv1/config")


def test_auth_errors(controller: Controller) -> None:
    r = controller.raw().get("/v1/vpcs")
    assert r.status_code == 401 and r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["field"] == "Authorization"
    assert controller.raw("nope").get("/v1/vpcs").status_code == 401
    # a token with bytes beyond ASCII is a wrong token (401), not a server error
    bad = controller.raw().get("/v1/vpcs", headers={"Authorization": b"Bearer \xff\xfe-caf\xc3\xa9"})
    assert bad.status_code == 401 and bad.json()["field"] == "Authorization"
    assert controller.raw(controller.admin_token).get("/v1/vpcs").status_code == 200
    ht = controller.admin.post("/v1/host-tokens", {"host": "hvx"})
    h = controller.raw(ht["token"])
    assert h.post("/v1/hosts", json={"name": "hvx", "vtep_ip": "172.31.9.9"}).status_code == 200
    assert h.get("/v1/vpcs").status_code == 403  # host tokens do not manage tenant resources
    mode = (controller.settings.state_dir / "admin.token").stat().st_mode & 0o777
    assert mode == 0o600


@pytest.mark.parametrize("cidr", ["10.0.0.0/7", "10.0.0.0/29", "10.0.0.1/16", "fd00::/48", "10.0.0.0", "banana",
                                  "300.0.0.0/16"])
def test_bad_vpc_cidrs(controller: Controller, cidr: str) -> None:
    a = controller.tenant()
    before = controller.snapshot()
    e = expect(422, make_vpc, a, "v", cidr, field="cidr")
    assert "cidr" in e.detail
    assert controller.snapshot() == before


def test_bad_input_changes_nothing(controller: Controller) -> None:
    a = controller.tenant()
    vpc = make_vpc(a)
    sn = a.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s1", "cidr": "10.0.0.0/28"})
    a.post("/v1/ports", {"subnet_id": sn["id"], "name": "fixed", "ip": "10.0.0.5"})
    orchestrator = controller.orchestrator()
    before = controller.snapshot()
    cases = [
        (409, "/v1/vpcs", {"name": "v1", "cidr": "10.1.0.0/16"}, "name"),
        (422, "/v1/vpcs", {"name": "v2", "cidr": "10.1.0.0/16", "colour": "blue"}, "colour"),
        (422, "/v1/vpcs", {"cidr": "10.1.0.0/16"}, "name"),
        (422, "/v1/subnets", {"vpc_id": vpc["id"], "name": "out", "cidr": "192.168.0.0/24"}, "cidr"),
        (409, "/v1/subnets", {"vpc_id": vpc["id"], "name": "ovl", "cidr": "10.0.0.0/24"}, "cidr"),
        (409, "/v1/subnets", {"vpc_id": vpc["id"], "name": "s1", "cidr": "10.0.5.0/24"}, "name"),
        (422, "/v1/ports", {"subnet_id": sn["id"], "name": "p", "ip": "10.0.1.5"}, "ip"),
        (422, "/v1/ports", {"subnet_id": sn["id"], "name": "p", "ip": "10.0.0.1"}, "ip"),    # gateway
        (422, "/v1/ports", {"subnet_id": sn["id"], "name": "p", "ip": "10.0.0.0"}, "ip"),    # network
        (422, "/v1/ports", {"subnet_id": sn["id"], "name": "p", "ip": "10.0.0.15"}, "ip"),   # broadcast
        (422, "/v1/ports", {"subnet_id": sn["id"], "name": "p", "ip": "not-an-ip"}, "ip"),
        (409, "/v1/ports", {"subnet_id": sn["id"], "name": "p", "ip": "10.0.0.5"}, "ip"),
        (422, "/v1/ports", {"subnet_id": sn["id"], "name": "p", "mac": "01:00:00:00:00:01"}, "mac"),
        (403, "/v1/ports", {"subnet_id": sn["id"], "name": "p", "host": "hv1"}, "host"),  # tenants do not bind
        (404, "/v1/ports", {"subnet_id": "no-such-subnet", "name": "p"}, "subnet_id"),
        (422, "/v1/ports", {"subnet_id": sn["id"], "name": "bad name!"}, "name"),
    ]
    for status, path, body, field in cases:
        e = expect(status, a.post, path, body, field=field)
        assert e.body["status"] == status and e.body["title"]
    expect(422, orchestrator.post, "/v1/ports", {"subnet_id": sn["id"], "name": "p", "host": "nowhere"},
           field="host")
    assert controller.snapshot() == before


def test_subnet_exhaustion(controller: Controller) -> None:
    a = controller.tenant()
    vpc = make_vpc(a)
    sn = a.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "tiny", "cidr": "10.0.0.16/28"})
    ips = [a.post("/v1/ports", {"subnet_id": sn["id"], "name": f"p{i}"})["ip"] for i in range(13)]
    assert sorted(ipaddress.IPv4Address(i) for i in ips) == [ipaddress.IPv4Address(f"10.0.0.{n}")
                                                             for n in range(18, 31)]
    before = controller.snapshot()
    e = expect(409, a.post, "/v1/ports", {"subnet_id": sn["id"], "name": "one-too-many"}, field="subnet_id")
    assert "no free addresses" in e.detail
    assert controller.snapshot() == before
    # a freed address is reused
    victim = a.get("/v1/ports", subnet_id=sn["id"])[4]
    a.delete(f"/v1/ports/{victim['id']}")
    assert a.post("/v1/ports", {"subnet_id": sn["id"], "name": "again"})["ip"] == victim["ip"]


def test_peering_same_and_cross_tenant(controller: Controller) -> None:
    a, b = controller.tenant(), controller.tenant()
    a1 = make_vpc(a, "a1", "10.1.0.0/16")
    a2 = make_vpc(a, "a2", "10.2.0.0/16")
    a3 = make_vpc(a, "a3", "10.1.128.0/17")
    b1 = make_vpc(b, "b1", "10.9.0.0/16")
    pc = a.post("/v1/peerings", {"requester_vpc_id": a1["id"], "accepter_vpc_id": a2["id"]})
    assert pc["status"] == "active"
    routes = a.get(f"/v1/vpcs/{a1['id']}/routes")
    assert {(r["destination"], r["target"]) for r in routes} == {("10.1.0.0/16", "local"),
                                                                  ("10.2.0.0/16", f"peering:{pc['id']}")}
    before = controller.snapshot()
    expect(409, a.post, "/v1/peerings", {"requester_vpc_id": a1["id"], "accepter_vpc_id": a3["id"]},
           field="accepter_vpc_id")  # overlapping CIDRs
    expect(409, a.post, "/v1/peerings", {"requester_vpc_id": a2["id"], "accepter_vpc_id": a1["id"]},
           field="accepter_vpc_id")  # already peered (either direction)
    expect(422, a.post, "/v1/peerings", {"requester_vpc_id": a1["id"], "accepter_vpc_id": a1["id"]})
    expect(404, b.post, "/v1/peerings", {"requester_vpc_id": a1["id"], "accepter_vpc_id": b1["id"]},
           field="requester_vpc_id")
    assert controller.snapshot() == before
    x = a.post("/v1/peerings", {"requester_vpc_id": a2["id"], "accepter_vpc_id": b1["id"]})
    assert x["status"] == "pending-acceptance"
    assert x["id"] in {p["id"] for p in b.get("/v1/peerings")}
    expect(403, a.post, f"/v1/peerings/{x['id']}/accept")  # only the accepter accepts
    assert not any(r["target"] == f"peering:{x['id']}" for r in a.get(f"/v1/vpcs/{a2['id']}/routes"))
    assert b.post(f"/v1/peerings/{x['id']}/accept")["status"] == "active"
    expect(409, b.post, f"/v1/peerings/{x['id']}/accept")
    # not transitive: a1 does not get a route to b1 through a2
    assert not any(r["destination"] == "10.9.0.0/16" for r in a.get(f"/v1/vpcs/{a1['id']}/routes"))
    # b still cannot see a's VPCs
    expect(404, b.get, f"/v1/vpcs/{a2['id']}")
    b.delete(f"/v1/peerings/{x['id']}")
    assert a.get("/v1/peerings") == [pc]
    y = a.post("/v1/peerings", {"requester_vpc_id": a3["id"], "accepter_vpc_id": b1["id"]})
    assert b.post(f"/v1/peerings/{y['id']}/reject")["status"] == "rejected"
    expect(409, a.delete, f"/v1/vpcs/{a1['id']}")  # still peered


def test_user_routes(controller: Controller) -> None:
    a = controller.tenant()
    a1, a2 = make_vpc(a, "a1", "10.1.0.0/16"), make_vpc(a, "a2", "10.2.0.0/16")
    pc = a.post("/v1/peerings", {"requester_vpc_id": a1["id"], "accepter_vpc_id": a2["id"]})
    r = a.post(f"/v1/vpcs/{a1['id']}/routes", {"destination": "10.2.5.0/24", "target": f"peering:{pc['id']}"})
    assert r["origin"] == "user" and r["id"]
    before = controller.snapshot()
    expect(409, a.post, f"/v1/vpcs/{a1['id']}/routes", {"destination": "10.2.5.0/24",
                                                         "target": f"peering:{pc['id']}"}, field="destination")
    expect(409, a.post, f"/v1/vpcs/{a1['id']}/routes", {"destination": "10.1.3.0/24",
                                                         "target": f"peering:{pc['id']}"}, field="destination")
    expect(422, a.post, f"/v1/vpcs/{a1['id']}/routes", {"destination": "10.3.0.0/16", "target": "nat:1"},
           field="target")
    expect(404, a.post, f"/v1/vpcs/{a1['id']}/routes", {"destination": "10.3.0.0/16", "target": "peering:zz"},
           field="target")
    expect(422, a.post, f"/v1/vpcs/{a1['id']}/routes", {"destination": "10.3.0.1/16",
                                                         "target": f"peering:{pc['id']}"}, field="destination")
    assert controller.snapshot() == before
    a.delete(f"/v1/peerings/{pc['id']}")
    states = {x["destination"]: x["state"] for x in a.get(f"/v1/vpcs/{a1['id']}/routes")}
    assert states == {"10.1.0.0/16": "active", "10.2.5.0/24": "blackhole"}
    a.delete(f"/v1/vpcs/{a1['id']}/routes/{r['id']}")


def test_a_new_group_allows_all_egress_unless_its_rules_are_given(controller: Controller) -> None:
    a = controller.tenant()
    vpc = make_vpc(a)
    plain = a.post("/v1/security-groups", {"vpc_id": vpc["id"], "name": "plain"})
    assert [(r["direction"], r["protocol"], r["remote_cidr"], r["port_range_min"]) for r in plain["rules"]] == [
        ("egress", "any", "0.0.0.0/0", None), ("egress", "any", "::/0", None)]  # as AWS and OpenStack, both families
    mute = a.post("/v1/security-groups", {"vpc_id": vpc["id"], "name": "mute", "rules": []})
    assert mute["rules"] == []
    only = a.post("/v1/security-groups", {"vpc_id": vpc["id"], "name": "only", "rules": [
        {"direction": "egress", "protocol": "tcp", "port_range_min": 443, "port_range_max": 443,
         "remote_cidr": "0.0.0.0/0"}]})
    assert [(r["direction"], r["port_range_min"]) for r in only["rules"]] == [("egress", 443)]
    assert a.get(f"/v1/security-groups/{plain['id']}")["rules"] == plain["rules"]


def test_security_groups(controller: Controller) -> None:
    a = controller.tenant()
    vpc = make_vpc(a)
    other = make_vpc(a, "other", "10.5.0.0/16")
    default = a.get(f"/v1/security-groups/{vpc['default_security_group_id']}")
    assert default["is_default"]
    assert {(r["direction"], r["ethertype"], r["protocol"], r["remote_cidr"], r["remote_group_id"])
            for r in default["rules"]} == {  # both families, as Neutron's default group (docs/dual-stack.md)
        ("egress", "IPv4", "any", "0.0.0.0/0", None), ("ingress", "IPv4", "any", None, default["id"]),
        ("egress", "IPv6", "any", "::/0", None), ("ingress", "IPv6", "any", None, default["id"])}
    web = a.post("/v1/security-groups", {"vpc_id": vpc["id"], "name": "web", "rules": [
        {"direction": "ingress", "protocol": "tcp", "port_range_min": 80, "port_range_max": 80,
         "remote_cidr": "0.0.0.0/0"}]})
    rule = a.post(f"/v1/security-groups/{web['id']}/rules",
                  {"direction": "ingress", "protocol": "icmp", "remote_group_id": default["id"]})
    assert rule["remote_group_id"] == default["id"]
    before = controller.snapshot()
    bad = [
        {"direction": "sideways", "protocol": "tcp"},
        {"direction": "ingress", "protocol": "tcp", "port_range_min": 90, "port_range_max": 80},
        {"direction": "ingress", "protocol": "icmp", "port_range_min": 1, "port_range_max": 2},
        {"direction": "ingress", "protocol": "tcp", "port_range_min": 0, "port_range_max": 2},
        {"direction": "ingress", "protocol": "tcp", "remote_cidr": "1.2.3.4/33"},
        {"direction": "ingress", "protocol": "tcp", "remote_cidr": "1.0.0.0/8", "remote_group_id": default["id"]},
    ]
    for body in bad:
        expect(422, a.post, f"/v1/security-groups/{web['id']}/rules", body)
    other_sg = other["default_security_group_id"]
    expect(422, a.post, f"/v1/security-groups/{web['id']}/rules",
           {"direction": "ingress", "remote_group_id": other_sg}, field="body.remote_group_id")
    expect(409, a.delete, f"/v1/security-groups/{default['id']}")
    assert controller.snapshot() == before
    sn = a.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.0.0.0/24"})
    p = a.post("/v1/ports", {"subnet_id": sn["id"], "name": "p", "security_group_ids": [web["id"], default["id"]]})
    assert sorted(p["security_group_ids"]) == sorted([web["id"], default["id"]])
    expect(422, a.post, "/v1/ports", {"subnet_id": sn["id"], "name": "q", "security_group_ids": [other_sg]},
           field="security_group_ids.0")
    expect(409, a.delete, f"/v1/security-groups/{web['id']}")  # in use
    a.patch(f"/v1/ports/{p['id']}", {"security_group_ids": [default["id"]]})
    a.delete(f"/v1/security-groups/{web['id']}/rules/{rule['id']}")
    a.delete(f"/v1/security-groups/{web['id']}")


def test_hosts_and_status(controller: Controller) -> None:
    adm = controller.admin
    h = adm.post("/v1/hosts", {"name": "hv1", "vtep_ip": "172.31.0.1"})
    assert h["status"] == "up"
    assert adm.post("/v1/hosts", {"name": "hv1", "vtep_ip": "172.31.0.1"})["name"] == "hv1"  # idempotent
    expect(409, adm.post, "/v1/hosts", {"name": "hv2", "vtep_ip": "172.31.0.1"}, field="vtep_ip")
    expect(422, adm.post, "/v1/hosts", {"name": "hv2", "vtep_ip": "172.31.0.300"}, field="vtep_ip")
    a = controller.tenant()
    vpc = make_vpc(a)
    sn = a.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.0.0.0/24"})
    p = controller.orchestrator().post("/v1/ports", {"subnet_id": sn["id"], "name": "p", "host": "hv1"})
    other = a.post("/v1/ports", {"subnet_id": sn["id"], "name": "q"})
    r = adm.post("/v1/hosts/hv1/status", {"ports": {p["id"]: "UP", other["id"]: "UP"}})
    assert r["updated_ports"] == 1 and r["ignored_ports"] == [other["id"]]  # a host reports only its own ports
    assert a.get(f"/v1/ports/{p['id']}")["status"] == "UP"
    assert a.get(f"/v1/ports/{other['id']}")["status"] == "DOWN"
    # several ports change at once, both ways; a beat that changes nothing writes no revision
    p2 = controller.orchestrator().post("/v1/ports", {"subnet_id": sn["id"], "name": "p2", "host": "hv1"})
    p3 = controller.orchestrator().post("/v1/ports", {"subnet_id": sn["id"], "name": "p3", "host": "hv1"})
    r = adm.post("/v1/hosts/hv1/status", {"ports": {p["id"]: "DOWN", p2["id"]: "UP", p3["id"]: "UP"}})
    assert r["updated_ports"] == 3
    assert [a.get(f"/v1/ports/{x['id']}")["status"] for x in (p, p2, p3)] == ["DOWN", "UP", "UP"]
    rev = controller.db.revision()
    for _ in range(3):
        assert adm.post("/v1/hosts/hv1/status", {"ports": {p["id"]: "DOWN", p2["id"]: "UP"}})["updated_ports"] == 0
        assert adm.post("/v1/hosts/hv1/status", {"ports": {}})["updated_ports"] == 0
    assert controller.db.revision() == rev
    expect(409, adm.delete, "/v1/hosts/hv1")
    expect(404, adm.post, "/v1/hosts/ghost/status", {"ports": {}})
    # each answer says how often beating is enough: a fifth of the silence that marks this kind of host down
    s = controller.app.state.settings
    assert r["beat_every"] == pytest.approx(s.host_down_after / 5)
    adm.post("/v1/hosts", {"name": "gw1", "vtep_ip": "172.31.1.1", "kind": "gateway", "role": "nat"})
    assert adm.post("/v1/hosts/gw1/status", {"ports": {}})["beat_every"] == pytest.approx(s.gateway_down_after / 5)


def test_openapi_and_docs(controller: Controller) -> None:
    r = controller.raw().get("/openapi.json")
    paths = r.json()["paths"]
    for p in ("/v1/vpcs", "/v1/subnets", "/v1/ports", "/v1/peerings", "/v1/security-groups",
              "/v1/vpcs/{vpc_id}/routes", "/v1/hosts/{name}/config", "/v1/hosts/{name}/status", "/v1/tenants"):
        assert p in paths
    assert controller.raw().get("/docs").status_code == 200
    doc = r.json()
    # the bearer scheme (Swagger UI's Authorize button) and the problem+json errors are declared
    assert doc["components"]["securitySchemes"]["HTTPBearer"] == {
        "type": "http", "scheme": "bearer", "description": "a tenant, host, orchestrator or the admin token"}
    for path, method, codes in (("/v1/vpcs", "post", "401 403 404 409 413 422 429"),  # 404: tenant_id
                                ("/v1/ports", "get", "401 403 404 422 429"),  # 404: a page marker
                                ("/v1/hosts/{name}/config", "get", "401 403 404 422 429")):
        op = paths[path][method]
        assert op["security"] == [{"HTTPBearer": []}]
        assert {c for c in op["responses"] if c[0] in "45"} == set(codes.split()), path  # its own, not every one
        for status in codes.split():
            schema = op["responses"][status]["content"]["application/problem+json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/Problem"}, (path, status)
    assert set(doc["components"]["schemas"]["Problem"]["properties"]) >= {"type", "title", "status", "detail",
                                                                           "field"}


def test_bulk_port_create_is_all_or_nothing(controller: Controller) -> None:
    a, b = controller.tenant(), controller.tenant()
    vpc = make_vpc(a)
    s1 = a.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s1", "cidr": "10.0.1.0/24"})
    s2 = a.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s2", "cidr": "10.0.2.0/28"})
    out = a.post("/v1/ports/bulk", {"ports": [{"subnet_id": s1["id"], "name": f"p{i}"} for i in range(5)]
                                    + [{"subnet_id": s2["id"], "name": "q", "ip": "10.0.2.9"}]})
    assert [p["ip"] for p in out] == ["10.0.1.2", "10.0.1.3", "10.0.1.4", "10.0.1.5", "10.0.1.6", "10.0.2.9"]
    assert len({p["mac"] for p in out}) == 6
    assert all(p["security_group_ids"] == [vpc["default_security_group_id"]] for p in out)
    assert {p["id"] for p in a.get("/v1/ports")} == {p["id"] for p in out}
    orchestrator = controller.orchestrator()
    before = controller.snapshot()
    # one bad item refuses the whole batch, and the error names it
    expect(409, a.post, "/v1/ports/bulk", {"ports": [{"subnet_id": s1["id"], "name": "ok"},
                                                     {"subnet_id": s2["id"], "name": "dup", "ip": "10.0.2.9"}]},
           field="ports.1.ip")
    expect(403, a.post, "/v1/ports/bulk", {"ports": [{"subnet_id": s1["id"], "name": "ok"},
                                                     {"subnet_id": s1["id"], "name": "x", "host": "hv1"}]},
           field="ports.1.host")  # binding is the orchestrator's
    bad_host = {"subnet_id": s1["id"], "name": "x", "host": "nohost"}
    expect(422, orchestrator.post, "/v1/ports/bulk", {"ports": [{"subnet_id": s1["id"], "name": "ok"}, bad_host]},
           field="ports.1.host")
    expect(404, b.post, "/v1/ports/bulk", {"ports": [{"subnet_id": s1["id"], "name": "theirs"}]},
           field="ports.0.subnet_id")
    expect(409, a.post, "/v1/ports/bulk", {"ports": [{"subnet_id": s2["id"], "name": f"f{i}"} for i in range(20)]},
           field="ports.12.subnet_id")  # a /28 holds 13 ports besides 10.0.2.9: the 13th exhausts it
    expect(422, a.post, "/v1/ports/bulk", {"ports": []})
    # the same address or MAC twice in one batch, or a MAC already in use
    expect(409, a.post, "/v1/ports/bulk", {"ports": [{"subnet_id": s1["id"], "name": "x", "ip": "10.0.1.50"},
                                                     {"subnet_id": s1["id"], "name": "y", "ip": "10.0.1.50"}]},
           field="ports.1.ip")
    expect(409, a.post, "/v1/ports/bulk", {"ports": [{"subnet_id": s1["id"], "name": "x", "mac": "02:00:00:00:00:01"},
                                                     {"subnet_id": s1["id"], "name": "y", "mac": "02:00:00:00:00:01"}]},
           field="ports.1.mac")
    expect(409, a.post, "/v1/ports/bulk", {"ports": [{"subnet_id": s1["id"], "name": "x"},
                                                     {"subnet_id": s1["id"], "name": "y", "mac": out[0]["mac"]}]},
           field="ports.1.mac")
    assert controller.snapshot() == before
    # a full subnet with gaps: a batch mixing fixed and allocated addresses fills the gaps, never twice
    fill = a.post("/v1/ports/bulk", {"ports": [{"subnet_id": s2["id"], "name": f"f{i}"} for i in range(12)]})
    assert len({p["ip"] for p in fill} | {"10.0.2.9"}) == 13
    for p in fill[3:6]:
        a.delete(f"/v1/ports/{p['id']}")
    gaps = sorted(p["ip"] for p in fill[3:6])
    again = a.post("/v1/ports/bulk", {"ports": [{"subnet_id": s2["id"], "name": "g0"},
                                                {"subnet_id": s2["id"], "name": "g1", "ip": gaps[0]},
                                                {"subnet_id": s2["id"], "name": "g2"}]})
    assert sorted(p["ip"] for p in again) == gaps


def test_vpc_mtu_up_to_the_underlay_and_in_the_host_config(controller: Controller) -> None:
    """A VPC's MTU: 1450 by default, at most the underlay's MTU less VXLAN's 50 bytes, handed to the hosts (DHCP
    gives it to VMs) and to the gateways (they fragment or refuse what is bigger on its way in)."""
    a = controller.tenant()
    assert make_vpc(a)["mtu"] == 1450
    e = expect(422, a.post, "/v1/vpcs", {"name": "big", "cidr": "10.1.0.0/16", "mtu": 1451}, field="mtu")
    assert "1450" in e.detail and "underlay" in e.detail
    expect(422, a.post, "/v1/vpcs", {"name": "tiny", "cidr": "10.1.0.0/16", "mtu": 1000}, field="mtu")
    assert [v["name"] for v in a.get("/v1/vpcs")] == ["v1"]  # refused writes changed nothing
    controller.settings.underlay_mtu = 3500  # the operator's larger underlay (TIANJI_UNDERLAY_MTU)
    big = a.post("/v1/vpcs", {"name": "big", "cidr": "10.1.0.0/16", "mtu": 3450})
    assert big["mtu"] == 3450
    expect(422, a.post, "/v1/vpcs", {"name": "bigger", "cidr": "10.2.0.0/16", "mtu": 3451}, field="mtu")
    controller.admin.post("/v1/hosts", {"name": "hv1", "vtep_ip": "172.31.0.1"})
    sn = a.post("/v1/subnets", {"vpc_id": big["id"], "name": "s", "cidr": "10.1.1.0/24"})
    controller.orchestrator().post("/v1/ports", {"subnet_id": sn["id"], "name": "vm", "host": "hv1"})
    cfg = controller.admin.get("/v1/hosts/hv1/config")
    assert [(v["id"], v["mtu"]) for v in cfg["vpcs"]] == [(big["id"], 3450)]


def test_a_ports_status_says_since_when_its_host_reported_it(controller: Controller) -> None:
    controller.admin.post("/v1/hosts", {"name": "hv1", "vtep_ip": "172.31.0.1"})
    a = controller.tenant()
    vpc = make_vpc(a)
    sn = a.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.0.0.0/24"})
    port = controller.orchestrator().post("/v1/ports", {"subnet_id": sn["id"], "name": "p", "host": "hv1"})
    assert port["status"] == "DOWN" and port["status_changed_at"] is None  # never reported
    host = controller.raw(controller.host_token("hv1"))
    assert host.post("/v1/hosts/hv1/status", json={"ports": {port["id"]: "UP"}}).json()["updated_ports"] == 1
    up = a.get(f"/v1/ports/{port['id']}")
    assert up["status"] == "UP" and up["status_changed_at"] is not None
    host.post("/v1/hosts/hv1/status", json={"ports": {port["id"]: "UP"}})  # the same again: no change
    assert a.get(f"/v1/ports/{port['id']}")["status_changed_at"] == up["status_changed_at"]
