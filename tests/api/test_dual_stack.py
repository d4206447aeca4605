"""Dual-stack VPCs through the API, on SQLite and PostgreSQL: a VPC's /56, its subnets' /64s, ports' IPv6
addresses (SLAAC's EUI-64 or DHCPv6-stateful's), IPv6 security-group rules and routes, peering; and bad input
refused with the field named and nothing changed."""

from __future__ import annotations

import ipaddress
import json

import pytest

from controller.api.ipam6 import eui64
from tests.conftest import Controller
from tianji.api_client import ApiFailure


def refused(controller: Controller, status: int, field: str | None, fn, *args):
    before = controller.snapshot()
    with pytest.raises(ApiFailure) as ei:
        fn(*args)
    assert ei.value.status == status, ei.value
    if field is not None:
        assert ei.value.field == field, ei.value.body
    assert controller.snapshot() == before, "a refused request changed something"
    return ei.value


def test_a_dual_stack_vpc_its_subnets_and_ports(controller: Controller) -> None:
    a = controller.tenant()
    vpc = a.post("/v1/vpcs", {"name": "ds", "cidr": "10.0.0.0/16", "ipv6_cidr": "auto"})
    net6 = ipaddress.IPv6Network(vpc["ipv6_cidr"])
    assert net6.prefixlen == 56 and net6.subnet_of(ipaddress.IPv6Network("fd00:7469::/32"))
    other = a.post("/v1/vpcs", {"name": "ds2", "cidr": "10.0.0.0/16", "ipv6_cidr": "auto"})
    assert not ipaddress.IPv6Network(other["ipv6_cidr"]).overlaps(net6)  # a pool's /56 is handed out once
    assert a.get(f"/v1/vpcs/{vpc['id']}")["ipv6_cidr"] == vpc["ipv6_cidr"]

    slaac = a.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.0.1.0/24", "ipv6_cidr": "auto"})
    assert slaac["ipv6_cidr"] == str(next(net6.subnets(new_prefix=64)))
    assert slaac["ipv6_gateway_ip"] == str(ipaddress.IPv6Network(slaac["ipv6_cidr"])[1])
    assert slaac["ipv6_address_mode"] == "slaac"
    p = a.post("/v1/ports", {"subnet_id": slaac["id"], "name": "vm1", "mac": "52:54:00:12:34:56"})
    assert p["ipv6"] == str(eui64(ipaddress.IPv6Network(slaac["ipv6_cidr"]), "52:54:00:12:34:56"))
    assert p["ipv6"].endswith(":5054:ff:fe12:3456")
    assert a.get(f"/v1/ports/{p['id']}")["ipv6"] == p["ipv6"]

    mine = str(list(net6.subnets(new_prefix=64))[7])
    stateful = a.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "d", "cidr": "10.0.2.0/24", "ipv6_cidr": mine,
                                      "ipv6_address_mode": "dhcpv6-stateful"})
    base = ipaddress.IPv6Network(mine).network_address
    q1 = a.post("/v1/ports", {"subnet_id": stateful["id"], "name": "vm2"})
    assert q1["ipv6"] == str(base + 2)  # ::1 is the router
    fixed = str(base + 0x100)
    q2 = a.post("/v1/ports", {"subnet_id": stateful["id"], "name": "vm3", "ipv6": fixed})
    q3 = a.post("/v1/ports", {"subnet_id": stateful["id"], "name": "vm4"})
    assert (q2["ipv6"], q3["ipv6"]) == (fixed, str(base + 0x101))
    bulk = a.post("/v1/ports/bulk", {"ports": [{"subnet_id": stateful["id"], "name": f"b{i}"} for i in range(3)]})
    assert [x["ipv6"] for x in bulk] == [str(base + 0x102 + i) for i in range(3)]

    v4 = a.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "v4only", "cidr": "10.0.3.0/24"})
    assert v4["ipv6_cidr"] is None and a.post("/v1/ports", {"subnet_id": v4["id"], "name": "x"})["ipv6"] is None
    routes = {r["destination"]: r["target"] for r in a.get(f"/v1/vpcs/{vpc['id']}/routes")}
    assert routes == {"10.0.0.0/16": "local", vpc["ipv6_cidr"]: "local"}


def test_dual_stack_bad_input_is_refused_and_changes_nothing(controller: Controller) -> None:
    a = controller.tenant()
    for cidr6, why in (("fd12:3456:789a::/48", "/56"), ("fd12:3456:789a:100::/64", "/56"), ("fe80::/56", "link-local"),
                       ("ff00::/56", "multicast"), ("fd12:3456:789a:0100::/56", "the usual way"),
                       ("10.1.0.0/16", "not IPv6"), ("fd00:7469:0:100::/56", "operator's pool")):
        e = refused(controller, 422, "ipv6_cidr", a.post, "/v1/vpcs", {"name": "x", "cidr": "10.0.0.0/16",
                                                                     "ipv6_cidr": cidr6})
        assert why in str(e), (cidr6, e)
    v4 = a.post("/v1/vpcs", {"name": "v4", "cidr": "10.0.0.0/16"})
    assert v4["ipv6_cidr"] is None
    e = refused(controller, 422, "ipv6_cidr", a.post, "/v1/subnets", {"vpc_id": v4["id"], "name": "s",
                                                                     "cidr": "10.0.1.0/24", "ipv6_cidr": "auto"})
    assert "no IPv6 CIDR" in str(e)
    ds = a.post("/v1/vpcs", {"name": "ds", "cidr": "10.0.0.0/16", "ipv6_cidr": "fd12:3456:789a:100::/56"})
    for cidr6, status, why in (("fd12:3456:789a:200::/64", 422, "not inside"),
                               ("fd12:3456:789a:100::/56", 422, "/64"),
                               ("fd12:3456:789a:100::1/64", 422, "host bits")):
        e = refused(controller, status, "ipv6_cidr", a.post, "/v1/subnets",
                    {"vpc_id": ds["id"], "name": "s", "cidr": "10.0.1.0/24", "ipv6_cidr": cidr6})
        assert why in str(e), (cidr6, e)
    sn = a.post("/v1/subnets", {"vpc_id": ds["id"], "name": "s", "cidr": "10.0.1.0/24",
                                "ipv6_cidr": "fd12:3456:789a:100::/64", "ipv6_address_mode": "dhcpv6-stateful"})
    e = refused(controller, 409, "ipv6_cidr", a.post, "/v1/subnets", {"vpc_id": ds["id"], "name": "t",
                                                                     "cidr": "10.0.2.0/24",
                                                                     "ipv6_cidr": "fd12:3456:789a:100::/64"})
    assert "subnet s's already" in str(e)
    for addr, why in (("fe80::1", "link-local"), ("ff02::1", "multicast"), ("::", "unspecified"),
                      ("fd12:3456:789a:100::1", "reserved"), ("fd12:3456:789a:100::", "reserved"),
                      ("fd12:3456:789a:101::5", "outside"), ("10.0.1.9", "not an IPv6")):
        e = refused(controller, 422, "ipv6", a.post, "/v1/ports", {"subnet_id": sn["id"], "name": "p", "ipv6": addr})
        assert why in str(e), (addr, e)
    a.post("/v1/ports", {"subnet_id": sn["id"], "name": "p", "ipv6": "fd12:3456:789a:100::9"})
    refused(controller, 409, "ipv6", a.post, "/v1/ports", {"subnet_id": sn["id"], "name": "q",
                                                          "ipv6": "fd12:3456:789a:100:0::9"})
    refused(controller, 409, "ports.1.ipv6", a.post, "/v1/ports/bulk", {"ports": [
        {"subnet_id": sn["id"], "name": "r", "ipv6": "fd12:3456:789a:100::a"},
        {"subnet_id": sn["id"], "name": "s", "ipv6": "fd12:3456:789a:100::a"}]})
    slaac = a.post("/v1/subnets", {"vpc_id": ds["id"], "name": "sl", "cidr": "10.0.3.0/24", "ipv6_cidr": "auto"})
    chosen = str(ipaddress.IPv6Network(slaac["ipv6_cidr"])[5])
    e = refused(controller, 422, "ipv6", a.post, "/v1/ports", {"subnet_id": slaac["id"], "name": "p2", "ipv6": chosen})
    assert "EUI-64" in str(e)
    v4sn = a.post("/v1/subnets", {"vpc_id": v4["id"], "name": "s", "cidr": "10.0.1.0/24"})
    refused(controller, 422, "ipv6", a.post, "/v1/ports", {"subnet_id": v4sn["id"], "name": "p",
                                                          "ipv6": "fd12:3456:789a:100::9"})
    e = refused(controller, 422, "destination", a.post, f"/v1/vpcs/{v4['id']}/routes",
                {"destination": "::/0", "target": "peering:nothing"})


def test_ipv6_security_group_rules(controller: Controller) -> None:
    a = controller.tenant()
    vpc = a.post("/v1/vpcs", {"name": "v", "cidr": "10.0.0.0/16"})
    default = a.get(f"/v1/security-groups/{vpc['default_security_group_id']}")
    got = sorted((r["direction"], r["ethertype"], r["remote_cidr"], r["remote_group_id"]) for r in default["rules"])
    assert got == sorted([("egress", "IPv4", "0.0.0.0/0", None), ("egress", "IPv6", "::/0", None),
                          ("ingress", "IPv4", None, default["id"]), ("ingress", "IPv6", None, default["id"])])
    sg = a.post("/v1/security-groups", {"vpc_id": vpc["id"], "name": "web"})
    assert sorted((r["ethertype"], r["remote_cidr"]) for r in sg["rules"]) == [("IPv4", "0.0.0.0/0"),
                                                                               ("IPv6", "::/0")]
    r = a.post(f"/v1/security-groups/{sg['id']}/rules", {"direction": "ingress", "protocol": "tcp",
                                                          "port_range_min": 22, "port_range_max": 22,
                                                          "remote_cidr": "2001:db8::/32"})
    assert (r["ethertype"], r["remote_cidr"]) == ("IPv6", "2001:db8::/32")
    r = a.post(f"/v1/security-groups/{sg['id']}/rules", {"direction": "ingress", "protocol": "ipv6-icmp",
                                                          "ethertype": "IPv6"})
    assert (r["protocol"], r["ethertype"], r["remote_cidr"]) == ("icmp", "IPv6", "::/0")
    r4 = a.post(f"/v1/security-groups/{sg['id']}/rules", {"direction": "ingress", "protocol": "icmp"})
    assert (r4["ethertype"], r4["remote_cidr"]) == ("IPv4", "0.0.0.0/0")  # the same rule of the other family
    refused(controller, 409, None, a.post, f"/v1/security-groups/{sg['id']}/rules",
            {"direction": "ingress", "protocol": "icmpv6", "ethertype": "IPv6"})
    for body, why in (({"ethertype": "IPv4", "remote_cidr": "::/0"}, "ethertype is IPv4"),
                      ({"ethertype": "IPv6", "remote_cidr": "10.0.0.0/8"}, "ethertype is IPv6"),
                      ({"protocol": "icmpv6"}, "IPv6's"), ({"remote_cidr": "2001:db8::1/32"}, "host bits"),
                      ({"ethertype": "IPv5"}, None)):
        e = refused(controller, 422, None, a.post, f"/v1/security-groups/{sg['id']}/rules",
                    {"direction": "ingress", **body})
        assert why is None or why in str(e), (body, e)


def test_ipv6_routes_and_peering(controller: Controller) -> None:
    a, b = controller.tenant(), controller.tenant()
    v1 = a.post("/v1/vpcs", {"name": "a", "cidr": "10.1.0.0/16", "ipv6_cidr": "fd12:0:0:100::/56"})
    v2 = a.post("/v1/vpcs", {"name": "b", "cidr": "10.2.0.0/16", "ipv6_cidr": "fd12:0:0:200::/56"})
    v3 = a.post("/v1/vpcs", {"name": "c", "cidr": "10.3.0.0/16"})
    pc = a.post("/v1/peerings", {"requester_vpc_id": v1["id"], "accepter_vpc_id": v2["id"]})
    routes = {r["destination"]: r["target"] for r in a.get(f"/v1/vpcs/{v1['id']}/routes")}
    assert routes[v2["ipv6_cidr"]] == routes["10.2.0.0/16"] == f"peering:{pc['id']}"
    pc3 = a.post("/v1/peerings", {"requester_vpc_id": v1["id"], "accepter_vpc_id": v3["id"]})
    assert {r["destination"] for r in a.get(f"/v1/vpcs/{v3['id']}/routes")} == {"10.3.0.0/16", "10.1.0.0/16"}
    r = a.post(f"/v1/vpcs/{v1['id']}/routes", {"destination": "fd99::/48", "target": f"peering:{pc['id']}"})
    assert r["destination"] == "fd99::/48"
    refused(controller, 409, "destination", a.post, f"/v1/vpcs/{v1['id']}/routes",
            {"destination": "fd12:0:0:180::/64", "target": f"peering:{pc['id']}"})
    refused(controller, 422, "destination", a.post, f"/v1/vpcs/{v3['id']}/routes",
            {"destination": "fd99::/48", "target": f"peering:{pc3['id']}"})
    e = refused(controller, 422, "destination", a.post, f"/v1/vpcs/{v1['id']}/routes",
                {"destination": "fd99::/48", "target": f"peering:{pc3['id']}"})
    assert "the peer has no IPv6" in str(e)
    vb = b.post("/v1/vpcs", {"name": "o", "cidr": "10.9.0.0/16", "ipv6_cidr": "fd12:0:0:100::/56"})
    e = refused(controller, 409, "accepter_vpc_id", a.post, "/v1/peerings",
                {"requester_vpc_id": v1["id"], "accepter_vpc_id": vb["id"]})
    assert "IPv6 CIDR overlaps fd12:0:0:100::/56" in str(e)  # ours is said, never the other tenant's


def test_load_balancers_and_services_say_they_are_ipv4_only(controller: Controller) -> None:
    a = controller.tenant()
    vpc = a.post("/v1/vpcs", {"name": "ds", "cidr": "10.0.0.0/16", "ipv6_cidr": "auto"})
    sn = a.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.0.1.0/24", "ipv6_cidr": "auto"})
    e = refused(controller, 422, "vip_address", a.post, "/v1/load-balancers",
                {"name": "web", "vpc_id": vpc["id"], "subnet_id": sn["id"], "vip_address": sn["ipv6_gateway_ip"]})
    assert "IPv4-only" in str(e)
    e = refused(controller, 422, None, controller.admin.post, "/v1/services",
                {"name": "store", "addresses": ["2001:db8::10"], "ports": [{"protocol": "tcp", "port": 443}]})
    assert "IPv4-only" in str(e)
    lb = a.post("/v1/load-balancers", {"name": "web", "vpc_id": vpc["id"], "subnet_id": sn["id"]})
    assert "." in lb["vip_address"]  # a dual-stack subnet's load balancer: its IPv4 VIP


def test_the_analyzer_answers_ipv6_questions_with_the_same_detail(controller: Controller) -> None:
    adm, orch = controller.admin, controller.orchestrator()
    for i, h in enumerate(("hv1", "hv2")):
        adm.post("/v1/hosts", {"name": h, "vtep_ip": f"172.31.0.{i + 1}"})
    t = controller.tenant()
    vpc = t.post("/v1/vpcs", {"name": "ds", "cidr": "10.0.0.0/16", "ipv6_cidr": "fd12:0:0:100::/56"})
    web = t.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "web", "cidr": "10.0.1.0/24", "ipv6_cidr": "auto"})
    db = t.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "db", "cidr": "10.0.2.0/24", "ipv6_cidr": "auto",
                                "ipv6_address_mode": "dhcpv6-stateful"})
    dbg = t.post("/v1/security-groups", {"vpc_id": vpc["id"], "name": "db", "rules": [
        {"direction": "ingress", "protocol": "tcp", "port_range_min": 5432, "port_range_max": 5432,
         "remote_cidr": web["ipv6_cidr"]}]})
    w1 = orch.post("/v1/ports", {"subnet_id": web["id"], "name": "w1", "host": "hv1"})
    w2 = orch.post("/v1/ports", {"subnet_id": web["id"], "name": "w2", "host": "hv2"})
    d1 = orch.post("/v1/ports", {"subnet_id": db["id"], "name": "d1", "host": "hv2",
                                 "security_group_ids": [dbg["id"]]})

    def ask(src: dict, proto: str, port: int | None, **dst) -> dict:
        body = {"source_port_id": src["id"], "destination": dst, "protocol": proto} | (
            {"port": port} if port else {})
        return t.post("/v1/reachability", body)

    a = ask(w1, "tcp", 22, ip=w2["ipv6"])
    assert a["verdict"] == "reachable", a
    assert a["source"]["ip"] == w1["ipv6"] and a["destination"]["ip"] == w2["ipv6"]
    nd = a["forward"]["hops"][0]["steps"][0]
    assert nd["table"] == "nd_responder" and w2["mac"] in nd["does"], nd  # on-link: the neighbour's MAC
    assert a["forward"]["delivered_to"] == w2["id"] and a["reply"]["delivered_to"] == w1["id"]
    a = ask(w1, "tcp", 5432, port_id=d1["id"], **{})
    assert a["destination"]["ip"] == d1["ip"]  # a port's IPv4 unless IPv6 is asked for
    a = t.post("/v1/reachability", {"source_port_id": w1["id"], "destination": {"port_id": d1["id"]},
                                    "protocol": "tcp", "port": 5432, "ip_version": 6})
    assert a["verdict"] == "reachable" and a["destination"]["ip"] == d1["ipv6"], a
    routed = [s for h in a["forward"]["hops"] for s in h["steps"] if s["table"] == "routing"]
    assert routed[0]["object"]["destination"] == vpc["ipv6_cidr"], routed  # off-link: the router, then the route
    ing = [s for h in a["forward"]["hops"] for s in h["steps"] if s["table"] == "ingress_acl"][0]
    assert ing["object"]["security_group_id"] == dbg["id"] and web["ipv6_cidr"] in ing["does"], ing
    a = ask(w1, "tcp", 443, ip=d1["ipv6"])
    assert a["verdict"] == "unreachable" and "no ingress rule" in a["reason"] and "tcp/443" in a["reason"], a
    a = ask(w1, "icmp", None, ip="fd12:0:0:1ff::9")
    assert a["verdict"] == "unreachable" and "no port has address fd12:0:0:1ff::9" in a["reason"], a
    a = ask(w1, "icmp", None, ip="fd99::9")
    assert a["verdict"] == "unreachable" and "no route to fd99::9" in a["reason"], a


def test_an_ipv4_only_port_asked_about_an_ipv6_destination_is_told_why(controller: Controller) -> None:
    controller.admin.post("/v1/hosts", {"name": "hv1", "vtep_ip": "172.31.0.1"})
    t = controller.tenant()
    vpc = t.post("/v1/vpcs", {"name": "v4", "cidr": "10.0.0.0/16"})
    sub = t.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.0.1.0/24"})
    p = controller.orchestrator().post("/v1/ports", {"subnet_id": sub["id"], "name": "p", "host": "hv1"})
    e = refused(controller, 409, "source_port_id", t.post, "/v1/reachability",
                {"source_port_id": p["id"], "destination": {"ip": "fd00::1"}, "protocol": "tcp", "port": 443})
    assert "no IPv6 address" in str(e), e


def test_an_ipv6_question_across_a_peer_tenants_peering_names_nothing_of_the_peer(controller: Controller) -> None:
    adm, orch = controller.admin, controller.orchestrator()
    for i, h in enumerate(("hv1", "hv2")):
        adm.post("/v1/hosts", {"name": h, "vtep_ip": f"172.31.0.{i + 1}"})
    a, b = controller.tenant("asker"), controller.tenant("t-quiet")
    va = a.post("/v1/vpcs", {"name": "mine", "cidr": "10.1.0.0/16", "ipv6_cidr": "auto"})
    sa = a.post("/v1/subnets", {"vpc_id": va["id"], "name": "mine", "cidr": "10.1.1.0/24", "ipv6_cidr": "auto"})
    vb = b.post("/v1/vpcs", {"name": "quiet", "cidr": "10.40.0.0/16", "ipv6_cidr": "auto", "mtu": 1280})
    sb = b.post("/v1/subnets", {"vpc_id": vb["id"], "name": "quiet-net", "cidr": "10.40.1.0/24", "ipv6_cidr": "auto"})
    sg = b.post("/v1/security-groups", {"vpc_id": vb["id"], "name": "quiet-web", "rules": [
        {"direction": "ingress", "protocol": "tcp", "port_range_min": 80, "port_range_max": 80, "ethertype": "IPv6",
         "remote_cidr": "::/0"}]})
    mine = orch.post("/v1/ports", {"subnet_id": sa["id"], "name": "w1", "host": "hv1"})
    theirs = orch.post("/v1/ports", {"subnet_id": sb["id"], "name": "quiet-vm", "host": "hv2"})
    b.patch(f"/v1/ports/{theirs['id']}", {"security_group_ids": [sg["id"]]})
    pc = a.post("/v1/peerings", {"requester_vpc_id": va["id"], "accepter_vpc_id": vb["id"]})
    b.post(f"/v1/peerings/{pc['id']}/accept")
    secrets = ["quiet", "quiet-net", "quiet-web", "quiet-vm", "t-quiet", b.tenant_id, vb["id"], sb["id"], sg["id"],
               theirs["id"], vb["default_security_group_id"], f"VNI {vb['vni']}", f'"vni": {vb["vni"]}']

    def ask(port: int) -> dict:
        return a.post("/v1/reachability", {"source_port_id": mine["id"], "destination": {"ip": theirs["ipv6"]},
                                           "protocol": "tcp", "port": port})

    yes, no = ask(80), ask(22)
    for answer in (yes, no):
        text = json.dumps(answer)
        assert not [s for s in secrets if s in text], answer
    assert yes["verdict"] == "reachable" and yes["source"]["ip"] == mine["ipv6"], yes
    assert yes["reason"] == "decided by the peer tenant's configuration: delivered; the reply returns", yes
    assert [h["host"] for h in yes["forward"]["hops"]] == ["hv1", "(the peer tenant's host)"]
    assert no["verdict"] == "unreachable" and no["reason"] == "decided by the peer tenant's configuration: dropped"
    whole = adm.post("/v1/reachability", {"source_port_id": mine["id"], "destination": {"ip": theirs["ipv6"]},
                                          "protocol": "tcp", "port": 22})
    assert "quiet-web" in json.dumps(whole) or "quiet-vm" in json.dumps(whole), "the admin sees the peer's objects"
