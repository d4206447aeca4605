"""Private lines through the API: validation (nothing changes on a refusal), tenancy, placement of the sessions on
the private-line instances, learned prefixes reported by an instance becoming the VPC's routes and the vSwitches'
(refused when they overlap the VPC, capped at max_prefixes), and the instances' sections."""

from __future__ import annotations

import pytest

from controller.southbound.placement import line_sessions
from tests.api.test_resources import expect, make_vpc
from tests.conftest import Controller

LINE = {"name": "dc1", "vlan_id": 100, "customer_asn": 65010, "customer_ip": "169.254.10.2/30",
        "local_ip": "169.254.10.1/30"}


def setup(controller: Controller):
    a = controller.tenant()
    vpc = make_vpc(a)
    sn = a.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.0.1.0/24"})
    adm = controller.admin
    adm.post("/v1/hosts", {"name": "hv1", "vtep_ip": "172.31.0.1"})
    port = a.post("/v1/ports", {"subnet_id": sn["id"], "name": "vm"})
    controller.orchestrator().patch(f"/v1/ports/{port['id']}", {"host": "hv1"})
    for i in (1, 2):
        adm.post("/v1/hosts", {"name": f"pl{i}", "vtep_ip": f"172.31.0.20{i}", "kind": "gateway",
                               "role": "private-line"})
    return a, vpc, port


def routes_of(c, vpc_id: str) -> dict[str, dict]:
    return {r["destination"]: r for r in c.get(f"/v1/vpcs/{vpc_id}/routes")}


def hv_routes(controller: Controller, vpc_id: str) -> dict[str, dict]:
    cfg = controller.admin.get("/v1/hosts/hv1/config")
    (v,) = [v for v in cfg["vpcs"] if v["id"] == vpc_id]
    return {r["destination"]: r for r in v["routes"]}


@pytest.mark.parametrize("bad,field", [
    ({"vlan_id": 0}, "vlan_id"), ({"vlan_id": 4095}, "vlan_id"), ({"vlan_id": 1}, "vlan_id"),
    ({"customer_asn": 0}, "customer_asn"), ({"customer_asn": 23456}, "customer_asn"),
    ({"customer_asn": 64512}, "customer_asn"), ({"customer_asn": 2**32}, "customer_asn"),
    ({"local_ip": "169.254.10.1/29"}, None), ({"local_ip": "169.254.10.1"}, "local_ip"),
    ({"local_ip": "169.254.10.5/30"}, None), ({"local_ip": "169.254.10.0/30"}, "local_ip"),
    ({"local_ip": "169.254.10.2/30"}, None), ({"local_ip": "10.0.0.1/30", "customer_ip": "10.0.0.2/30"}, "local_ip"),
    ({"max_prefixes": 0}, "max_prefixes"), ({"md5_password": "x" * 81}, "md5_password"),
    ({"md5_password": "has space"}, "md5_password"), ({"static_routes": ["10.0.5.0/24"]}, "static_routes.0"),
    ({"static_routes": ["192.168.0.0/24", "192.168.0.0/24"]}, "static_routes"),
    ({"secondary": {"local_ip": "169.254.10.1/30", "customer_ip": "169.254.10.2/30"}}, None),
    ({"secondary": {"local_ip": "169.254.11.1/31", "customer_ip": "169.254.11.0/31"}}, "secondary"),
])
def test_bad_lines_are_refused_and_change_nothing(controller: Controller, bad: dict, field: str | None) -> None:
    a, vpc, _ = setup(controller)
    before = controller.snapshot()
    e = expect(409 if field in ("static_routes.0",) or bad.get("local_ip", "").startswith("10.") else 422,
               a.post, "/v1/private-lines", LINE | {"vpc_id": vpc["id"]} | bad)
    if field is not None:
        assert e.field == field, e.body
    assert controller.snapshot() == before


def test_line_lifecycle_vlan_conflict_and_tenancy(controller: Controller) -> None:
    a, vpc, _ = setup(controller)
    line = a.post("/v1/private-lines", LINE | {"vpc_id": vpc["id"], "md5_password": "s3cret",
                                              "static_routes": ["192.168.20.0/24"]})
    assert line["md5"] is True and "md5_password" not in line
    assert line["local_asn"] == 64512 and line["advertised"] == ["10.0.0.0/16"]
    assert [s["instance"] for s in line["sessions"]] in (["pl1"], ["pl2"])
    assert line["sessions"][0]["bgp_state"] == "Idle"
    b = controller.tenant()
    vb = make_vpc(b)
    e = expect(409, b.post, "/v1/private-lines", LINE | {"vpc_id": vb["id"]}, field="vlan_id")
    assert line["id"] not in e.detail  # another tenant's line is not named
    expect(404, b.get, f"/v1/private-lines/{line['id']}")
    expect(404, b.delete, f"/v1/private-lines/{line['id']}")
    expect(404, b.post, "/v1/private-lines", LINE | {"vpc_id": vpc["id"], "vlan_id": 200}, field="vpc_id")
    assert b.get("/v1/private-lines") == []
    assert [x["id"] for x in a.get("/v1/private-lines")] == [line["id"]]
    # its static route is the VPC's, through the instance carrying the session
    r = routes_of(a, vpc["id"])["192.168.20.0/24"]
    assert (r["target"], r["origin"], r["state"]) == (f"private-line:{line['id']}", "static", "active")
    hv = hv_routes(controller, vpc["id"])["192.168.20.0/24"]
    inst = line["sessions"][0]["instance"]
    assert hv["target_type"] == "private-line" and hv["gateway_vteps"] == [f"172.31.0.20{inst[-1]}"]
    upd = a.patch(f"/v1/private-lines/{line['id']}", {"static_routes": ["192.168.30.0/24"], "max_prefixes": 5})
    assert upd["static_routes"] == ["192.168.30.0/24"] and upd["max_prefixes"] == 5
    assert "192.168.20.0/24" not in routes_of(a, vpc["id"])
    expect(409, a.delete, f"/v1/vpcs/{vpc['id']}")
    a.delete(f"/v1/private-lines/{line['id']}")
    assert "192.168.30.0/24" not in routes_of(a, vpc["id"])
    assert b.post("/v1/private-lines", LINE | {"vpc_id": vb["id"]})["vlan_id"] == 100  # the VLAN is free again


def test_learned_prefixes_become_routes_refused_ones_are_reported(controller: Controller) -> None:
    a, vpc, _ = setup(controller)
    line = a.post("/v1/private-lines", LINE | {"vpc_id": vpc["id"], "max_prefixes": 2,
                                              "secondary": {"local_ip": "169.254.11.1/30",
                                                            "customer_ip": "169.254.11.2/30"}})
    placed = {s["local_ip"]: s["instance"] for s in line["sessions"]}
    assert set(placed.values()) == {"pl1", "pl2"}  # the redundant pair on two instances
    inst = placed["169.254.10.1/30"]
    other = placed["169.254.11.1/30"]
    gw = controller.raw(controller.host_token(inst, "gateway"))
    report = {"sessions": [{"local_ip": "169.254.10.1", "bgp_state": "Established", "bfd_state": "up",
                            "received": 5, "advertised": 1,
                            "prefixes": ["192.168.10.0/24", "192.168.11.0/24", "10.0.5.0/24", "0.0.0.0/0",
                                         "172.16.0.0/16"]}]}
    r = gw.put(f"/v1/gateways/{inst}/private-lines/{line['id']}", json=report)
    assert r.status_code == 200, r.text
    got = a.get(f"/v1/private-lines/{line['id']}")
    (s,) = [x for x in got["sessions"] if x["instance"] == inst]
    assert s["bgp_state"] == "Established" and s["accepted"] == 2
    reasons = {x["prefix"]: x["reason"] for x in s["refused"]}
    assert "VPC's CIDR" in reasons["10.0.5.0/24"]  # inside the VPC; a default route covering it is fine ...
    assert "max_prefixes" in reasons["0.0.0.0/0"] and "max_prefixes" in reasons["172.16.0.0/16"]  # ... over 2
    routes = routes_of(a, vpc["id"])
    for p in ("192.168.10.0/24", "192.168.11.0/24"):
        assert (routes[p]["origin"], routes[p]["target"]) == ("bgp", f"private-line:{line['id']}")
    assert "10.0.5.0/24" not in routes and "0.0.0.0/0" not in routes
    hv = hv_routes(controller, vpc["id"])["192.168.10.0/24"]
    assert hv["gateway_vteps"] == [f"172.31.0.20{inst[-1]}"] and len(hv["gateway_buckets"]) == 8
    # the other instance learns the same prefix: both carry it (the VMs' buckets split over them)
    gw2 = controller.raw(controller.host_token(other, "gateway"))
    r = gw2.put(f"/v1/gateways/{other}/private-lines/{line['id']}",
                json={"sessions": [{"local_ip": "169.254.11.1/30", "bgp_state": "Established",
                                    "prefixes": ["192.168.10.0/24"]}]})
    assert r.status_code == 200, r.text
    hv = hv_routes(controller, vpc["id"])["192.168.10.0/24"]
    assert hv["gateway_vteps"] == ["172.31.0.201", "172.31.0.202"]
    assert set(hv["gateway_buckets"]) == {"172.31.0.201", "172.31.0.202"}
    # a session not placed on the reporting instance, or another instance's report: refused
    bad = gw2.put(f"/v1/gateways/{other}/private-lines/{line['id']}",
                  json={"sessions": [{"local_ip": "169.254.10.1", "bgp_state": "Established"}]})
    assert bad.status_code == 409, bad.text
    assert gw2.put(f"/v1/gateways/{inst}/private-lines/{line['id']}", json=report).status_code == 403
    # the session goes down: its prefixes go with it
    r = gw.put(f"/v1/gateways/{inst}/private-lines/{line['id']}",
               json={"sessions": [{"local_ip": "169.254.10.1", "bgp_state": "Idle",
                                   "last_error": "max-prefix exceeded"}]})
    assert r.json()["changed"] is True
    routes = routes_of(a, vpc["id"])
    assert "192.168.11.0/24" not in routes and routes["192.168.10.0/24"]["origin"] == "bgp"
    got = a.get(f"/v1/private-lines/{line['id']}")
    assert {x["instance"]: x["last_error"] for x in got["sessions"]}[inst] == "max-prefix exceeded"


def test_the_instances_sections(controller: Controller) -> None:
    a, vpc, port = setup(controller)
    line = a.post("/v1/private-lines", LINE | {"vpc_id": vpc["id"], "md5_password": "s3cret",
                                              "static_routes": ["192.168.20.0/24"]})
    inst = line["sessions"][0]["instance"]
    other = {"pl1": "pl2", "pl2": "pl1"}[inst]
    cfg = controller.admin.get(f"/v1/gateways/{inst}/config")
    (x,) = cfg["lines"]
    assert (x["id"], x["vlan_id"], x["customer_asn"], x["local_asn"], x["md5_password"], x["vpc_cidr"]) == \
        (line["id"], 100, 65010, 64512, "s3cret", "10.0.0.0/16")
    assert x["sessions"] == [{"local_ip": "169.254.10.1/30", "customer_ip": "169.254.10.2/30", "prefixlen": 30}]
    assert x["static_routes"] == ["192.168.20.0/24"] and x["vni"] == vpc["vni"]
    assert [e["ip"] for e in cfg["endpoints"]] == [port["ip"]]
    assert controller.admin.get(f"/v1/gateways/{other}/config")["lines"] == []
    # the instance carrying the session goes down: the session moves to the other
    with controller.db.write() as t:
        from controller.state import models as m

        t.session.get(m.Host, inst).status = "down"
    assert [s["instance"] for s in a.get(f"/v1/private-lines/{line['id']}")["sessions"]] == [other]
    assert controller.admin.get(f"/v1/gateways/{other}/config")["lines"][0]["id"] == line["id"]
    assert hv_routes(controller, vpc["id"])["192.168.20.0/24"]["gateway_vteps"] == [f"172.31.0.20{other[-1]}"]


def test_what_an_instance_learned_stops_routing_when_the_session_moves_away(controller: Controller) -> None:
    a, vpc, _ = setup(controller)
    line = a.post("/v1/private-lines", LINE | {"vpc_id": vpc["id"]})
    first = line["sessions"][0]["instance"]
    controller.admin.put(f"/v1/gateways/{first}/private-lines/{line['id']}", {"sessions": [{
        "local_ip": "169.254.10.1", "bgp_state": "Established", "prefixes": ["192.168.10.0/24"]}]})
    assert hv_routes(controller, vpc["id"])["192.168.10.0/24"]["gateway_vteps"] == [f"172.31.0.20{first[-1]}"]
    # a new instance that outweighs the first for this line (rendezvous) takes nothing by itself (a session moved
    # is a session down); the operator's rebalance moves it there
    name = next(n for k in range(1000) if line_sessions(line["id"], [("", "")], [first, n := f"plx{k}"])[0][0] == n)
    controller.admin.post("/v1/hosts", {"name": name, "vtep_ip": "172.31.0.250", "kind": "gateway",
                                        "role": "private-line"})
    assert a.get(f"/v1/private-lines/{line['id']}")["sessions"][0]["instance"] == first
    r = controller.raw(a.token).post(f"/v1/private-lines/{line['id']}/rebalance")
    assert r.status_code == 403  # the operator's
    assert controller.admin.post(f"/v1/private-lines/{line['id']}/rebalance", {})["sessions"][0]["instance"] == name
    assert a.get(f"/v1/private-lines/{line['id']}")["sessions"][0]["instance"] == name
    # the first instance is alive, but its session went: what it learned routes nothing any more
    assert "192.168.10.0/24" not in hv_routes(controller, vpc["id"])
    assert a.get(f"/v1/private-lines/{line['id']}")["learned_routes"] == []


def test_sessions_stay_where_they_run_when_an_instance_comes_back(controller: Controller) -> None:
    """The instance carrying a session dies (the liveness check): the session moves to the other; the first
    comes back: the session stays where it runs (moving it would take it down), until the operator rebalances.
    What the dead instance learned is gone with it: it routes nothing when it comes back."""
    from controller.southbound.liveness import mark_silent_hosts_down

    a, vpc, _ = setup(controller)
    line = a.post("/v1/private-lines", LINE | {"vpc_id": vpc["id"]})
    first = line["sessions"][0]["instance"]
    controller.admin.put(f"/v1/gateways/{first}/private-lines/{line['id']}", {"sessions": [{
        "local_ip": "169.254.10.1", "bgp_state": "Established", "prefixes": ["192.168.10.0/24"]}]})
    others = [h["name"] for h in controller.admin.get("/v1/hosts")
              if h.get("role") == "private-line" and h["name"] != first]
    hosts = controller.raw(controller.admin_token)
    for h in others:
        hosts.post(f"/v1/hosts/{h}/status", json={"ports": {}})
    with controller.db.write() as t:
        from controller.state import models as m

        t.session.get(m.Host, first).last_seen = t.session.get(m.Host, first).last_seen.replace(year=2000)
    assert first in mark_silent_hosts_down(controller.db, 3600, 3600)
    moved = a.get(f"/v1/private-lines/{line['id']}")
    assert moved["sessions"][0]["instance"] in others and moved["learned_routes"] == []
    assert "192.168.10.0/24" not in hv_routes(controller, vpc["id"])
    hosts.post(f"/v1/hosts/{first}/status", json={"ports": {}})  # back up
    assert controller.admin.get(f"/v1/hosts/{first}")["status"] == "up"
    back = a.get(f"/v1/private-lines/{line['id']}")
    assert back["sessions"][0]["instance"] == moved["sessions"][0]["instance"]
    assert controller.admin.get(f"/v1/gateways/{first}/config")["lines"] == []
    assert controller.admin.post(f"/v1/private-lines/{line['id']}/rebalance", {})["sessions"][0]["instance"] == first
