"""The load-balancer API on SQLite and PostgreSQL: the objects, their checks, their statuses, tenant isolation."""

from __future__ import annotations

from tests.api.test_resources import expect, make_vpc
from tests.conftest import Controller


def lb_setup(controller: Controller, tenant=None):
    a = tenant or controller.tenant()
    vpc = make_vpc(a)
    sn = a.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.0.1.0/24"})
    lb = a.post("/v1/load-balancers", {"name": "web", "vpc_id": vpc["id"], "subnet_id": sn["id"]})
    return a, vpc, sn, lb


def test_load_balancer_lifecycle(controller: Controller) -> None:
    a, vpc, sn, lb = lb_setup(controller)
    assert lb["vip_address"] == "10.0.1.2" and lb["provisioning_status"] == "ACTIVE"
    assert lb["operating_status"] == "ONLINE" and lb["vpc_id"] == vpc["id"]
    vip_port = a.get(f"/v1/ports/{lb['vip_port_id']}")
    assert vip_port["ip"] == lb["vip_address"] and vip_port["security_group_ids"] == []
    pool = a.post("/v1/pools", {"load_balancer_id": lb["id"], "name": "p", "protocol": "tcp"})
    assert (pool["algorithm"], pool["table_size"], pool["deregistration_delay_s"]) == ("maglev", 65537, 30)
    listener = a.post(f"/v1/load-balancers/{lb['id']}/listeners",
                      {"protocol": "tcp", "port": 80, "default_pool_id": pool["id"]})
    assert listener["idle_timeout_s"] == 350
    expect(409, a.post, f"/v1/load-balancers/{lb['id']}/listeners", {"protocol": "tcp", "port": 80}, field="port")
    ports = [a.post("/v1/ports", {"subnet_id": sn["id"], "name": f"b{i}"}) for i in range(3)]
    members = [a.post(f"/v1/pools/{pool['id']}/members", {"port_id": p["id"], "protocol_port": 8080,
                                                          "weight": i + 1}) for i, p in enumerate(ports)]
    assert [x["operating_status"] for x in members] == ["NO_MONITOR"] * 3
    assert [x["address"] for x in members] == [p["ip"] for p in ports]
    got = a.get(f"/v1/load-balancers/{lb['id']}")
    assert got["listener_ids"] == [listener["id"]] and got["pool_ids"] == [pool["id"]]
    drained = a.patch(f"/v1/pools/{pool['id']}/members/{members[0]['id']}", {"weight": 0})
    assert drained["operating_status"] == "DRAINING" and drained["weight"] == 0
    hm = a.put(f"/v1/pools/{pool['id']}/health-monitor", {"type": "http", "interval_s": 2, "timeout_s": 1,
                                                          "rise": 2, "fall": 3})
    assert (hm["http_method"], hm["url_path"], hm["expected_codes"]) == ("GET", "/", "200")
    statuses = {x["id"]: x["operating_status"] for x in a.get(f"/v1/pools/{pool['id']}/members")}
    assert statuses == {members[0]["id"]: "DRAINING", members[1]["id"]: "OFFLINE", members[2]["id"]: "OFFLINE"}
    assert a.get(f"/v1/pools/{pool['id']}")["operating_status"] == "OFFLINE"  # no check has passed yet
    assert a.get(f"/v1/load-balancers/{lb['id']}")["operating_status"] == "OFFLINE"
    a.delete(f"/v1/pools/{pool['id']}/health-monitor")
    assert {x["operating_status"] for x in a.get(f"/v1/pools/{pool['id']}/members")} == {"DRAINING", "NO_MONITOR"}
    expect(404, a.get, f"/v1/pools/{pool['id']}/health-monitor")
    expect(409, a.delete, f"/v1/pools/{pool['id']}")  # a listener's default pool
    expect(409, a.delete, f"/v1/ports/{ports[1]['id']}")  # a member
    expect(409, a.delete, f"/v1/ports/{lb['vip_port_id']}")  # the VIP
    a.delete(f"/v1/pools/{pool['id']}/members/{members[1]['id']}")
    a.delete(f"/v1/ports/{ports[1]['id']}")
    a.delete(f"/v1/load-balancers/{lb['id']}")
    expect(404, a.get, f"/v1/load-balancers/{lb['id']}")
    expect(404, a.get, f"/v1/pools/{pool['id']}")
    expect(404, a.get, f"/v1/ports/{lb['vip_port_id']}")
    again = a.post("/v1/load-balancers", {"name": "web", "vpc_id": vpc["id"], "subnet_id": sn["id"],
                                          "vip_address": lb["vip_address"]})
    assert again["vip_address"] == lb["vip_address"]  # the address went back to the subnet


def test_bad_input_is_refused_naming_the_field_and_changes_nothing(controller: Controller) -> None:
    a, vpc, sn, lb = lb_setup(controller)
    n_ports = len(a.get("/v1/ports"))
    expect(409, a.post, "/v1/load-balancers", {"name": "web", "vpc_id": vpc["id"], "subnet_id": sn["id"]},
           field="name")
    expect(409, a.post, "/v1/load-balancers", {"name": "b", "vpc_id": vpc["id"], "subnet_id": sn["id"],
                                               "vip_address": lb["vip_address"]}, field="vip_address")
    expect(422, a.post, "/v1/load-balancers", {"name": "c", "vpc_id": vpc["id"], "subnet_id": sn["id"],
                                               "vip_address": "10.9.9.9"}, field="vip_address")
    other = a.post("/v1/vpcs", {"name": "other", "cidr": "10.1.0.0/16"})
    expect(422, a.post, "/v1/load-balancers", {"name": "d", "vpc_id": other["id"], "subnet_id": sn["id"]},
           field="subnet_id")
    assert len(a.get("/v1/ports")) == n_ports and len(a.get("/v1/load-balancers")) == 1
    for body, field in (({"table_size": 65536}, "table_size"), ({"table_size": 7}, "table_size"),
                        ({"algorithm": "round_robin"}, "algorithm"), ({"protocol": "http"}, "protocol")):
        expect(422, a.post, "/v1/pools", {"load_balancer_id": lb["id"], "name": "p", "protocol": "tcp"} | body,
               field=field)
    pool = a.post("/v1/pools", {"load_balancer_id": lb["id"], "name": "p", "protocol": "udp",
                                "algorithm": "source_ip", "table_size": 131071})
    expect(422, a.post, f"/v1/load-balancers/{lb['id']}/listeners",
           {"protocol": "tcp", "port": 80, "default_pool_id": pool["id"]}, field="default_pool_id")
    port = a.post("/v1/ports", {"subnet_id": sn["id"], "name": "b"})
    expect(422, a.post, f"/v1/pools/{pool['id']}/members", {"port_id": port["id"], "protocol_port": 7,
                                                            "weight": 257}, field="weight")
    expect(422, a.post, f"/v1/pools/{pool['id']}/members", {"port_id": lb["vip_port_id"], "protocol_port": 7},
           field="port_id")
    osn = a.post("/v1/subnets", {"vpc_id": other["id"], "name": "o", "cidr": "10.1.1.0/24"})
    elsewhere = a.post("/v1/ports", {"subnet_id": osn["id"], "name": "e"})
    expect(422, a.post, f"/v1/pools/{pool['id']}/members", {"port_id": elsewhere["id"], "protocol_port": 7},
           field="port_id")
    for body in ({"timeout_s": 3}, {"http_method": "GET"}, {"rise": 11}, {"type": "icmp"}):
        expect(422, a.put, f"/v1/pools/{pool['id']}/health-monitor",
               {"type": "tcp", "interval_s": 2, "timeout_s": 1, "rise": 2, "fall": 2} | body)
    expect(422, a.put, f"/v1/pools/{pool['id']}/health-monitor",
           {"type": "http", "interval_s": 2, "timeout_s": 1, "rise": 2, "fall": 2, "expected_codes": "2xx"},
           field="expected_codes")
    assert a.get(f"/v1/pools/{pool['id']}")["member_ids"] == []


def test_eip_fronts_one_thing(controller: Controller) -> None:
    controller.admin.post("/v1/eip-pools", {"cidr": "203.0.113.0/24"})
    a, vpc, sn, lb = lb_setup(controller)
    eip = a.post("/v1/eips", {})
    lb2 = a.post("/v1/load-balancers", {"name": "pub", "vpc_id": vpc["id"], "subnet_id": sn["id"],
                                        "eip_id": eip["id"]})
    assert lb2["eip_address"] == eip["address"]
    expect(409, a.post, "/v1/load-balancers", {"name": "pub2", "vpc_id": vpc["id"], "subnet_id": sn["id"],
                                               "eip_id": eip["id"]}, field="eip_id")
    port = a.post("/v1/ports", {"subnet_id": sn["id"], "name": "vm"})
    expect(409, a.post, f"/v1/eips/{eip['id']}/associate", {"port_id": port["id"]})
    expect(409, a.delete, f"/v1/eips/{eip['id']}")
    a.delete(f"/v1/load-balancers/{lb2['id']}")
    a.post(f"/v1/eips/{eip['id']}/associate", {"port_id": port["id"]})  # free again


def test_tenants_never_see_or_use_each_others(controller: Controller) -> None:
    a, vpc, sn, lb = lb_setup(controller)
    pool = a.post("/v1/pools", {"load_balancer_id": lb["id"], "name": "p", "protocol": "tcp"})
    a_port = a.post("/v1/ports", {"subnet_id": sn["id"], "name": "vm"})
    b, bvpc, bsn, blb = lb_setup(controller)  # identical VIP and addresses, another tenant
    assert blb["vip_address"] == lb["vip_address"]
    bpool = b.post("/v1/pools", {"load_balancer_id": blb["id"], "name": "p", "protocol": "tcp"})
    for path in (f"/v1/load-balancers/{lb['id']}", f"/v1/pools/{pool['id']}", f"/v1/pools/{pool['id']}/members",
                 f"/v1/load-balancers/{lb['id']}/listeners"):
        expect(404, b.get, path)
    assert [x["id"] for x in b.get("/v1/load-balancers")] == [blb["id"]]
    assert [x["id"] for x in b.get("/v1/pools")] == [bpool["id"]]
    expect(404, b.post, f"/v1/pools/{bpool['id']}/members", {"port_id": a_port["id"], "protocol_port": 80},
           field="port_id")
    expect(404, b.post, f"/v1/load-balancers/{blb['id']}/listeners",
           {"protocol": "tcp", "port": 80, "default_pool_id": pool["id"]}, field="default_pool_id")
    expect(404, b.post, "/v1/pools", {"load_balancer_id": lb["id"], "name": "x", "protocol": "tcp"},
           field="load_balancer_id")
    expect(404, b.delete, f"/v1/load-balancers/{lb['id']}")
    assert a.get(f"/v1/load-balancers/{lb['id']}")["id"] == lb["id"]


def test_health_reports_come_from_the_members_own_host(controller: Controller) -> None:
    a, vpc, sn, lb = lb_setup(controller)
    adm = controller.admin
    for i in (1, 2):
        adm.post("/v1/hosts", {"name": f"hv{i}", "vtep_ip": f"172.31.0.{i}"})
    pool = a.post("/v1/pools", {"load_balancer_id": lb["id"], "name": "p", "protocol": "tcp"})
    port = a.post("/v1/ports", {"subnet_id": sn["id"], "name": "b"})
    controller.orchestrator().patch(f"/v1/ports/{port['id']}", {"host": "hv1"})
    member = a.post(f"/v1/pools/{pool['id']}/members", {"port_id": port["id"], "protocol_port": 80})
    a.put(f"/v1/pools/{pool['id']}/health-monitor", {"type": "tcp", "interval_s": 1, "timeout_s": 1, "rise": 1,
                                                     "fall": 1})
    hv1, hv2 = controller.raw(controller.host_token("hv1")), controller.raw(controller.host_token("hv2"))
    report = {"members": {member["id"]: "ONLINE"}}
    assert hv2.post("/v1/hosts/hv2/lb-health", json=report).status_code == 404  # not its member
    assert hv2.post("/v1/hosts/hv1/lb-health", json=report).status_code == 403  # not its host
    assert controller.raw(a.http.headers["Authorization"].split()[1]).post("/v1/hosts/hv1/lb-health",
                                                                           json=report).status_code == 403
    assert hv1.post("/v1/hosts/hv1/lb-health", json={"members": {member["id"]: "UP"}}).status_code == 422
    assert a.get(f"/v1/pools/{pool['id']}/members")[0]["operating_status"] == "OFFLINE"
    got = hv1.post("/v1/hosts/hv1/lb-health", json=report)
    assert got.status_code == 200 and got.json() == {"changed": 1}
    assert a.get(f"/v1/pools/{pool['id']}/members")[0]["operating_status"] == "ONLINE"
    assert a.get(f"/v1/pools/{pool['id']}")["operating_status"] == "ONLINE"


def test_a_pool_keeps_100_table_entries_per_member(controller: Controller) -> None:
    a, vpc, sn, lb = lb_setup(controller)
    pool = a.post("/v1/pools", {"load_balancer_id": lb["id"], "name": "small", "protocol": "tcp", "table_size": 251})
    ports = [a.post("/v1/ports", {"subnet_id": sn["id"], "name": f"b{i}"}) for i in range(3)]
    for p in ports[:2]:
        a.post(f"/v1/pools/{pool['id']}/members", {"port_id": p["id"], "protocol_port": 80})
    expect(409, a.post, f"/v1/pools/{pool['id']}/members", {"port_id": ports[2]["id"], "protocol_port": 80},
           field="port_id")
    assert len(a.get(f"/v1/pools/{pool['id']}/members")) == 2


def test_an_lb_eip_is_homed_on_an_lb_instance(controller: Controller) -> None:
    adm = controller.admin
    adm.post("/v1/hosts", {"name": "gw1", "vtep_ip": "172.31.0.21", "kind": "gateway"})
    adm.post("/v1/hosts", {"name": "lb1", "vtep_ip": "172.31.0.31", "kind": "gateway", "role": "lb"})
    assert {h["name"]: h["role"] for h in adm.get("/v1/hosts") if h["kind"] == "gateway"} == {"gw1": "nat",
                                                                                           "lb1": "lb"}
    expect(422, adm.post, "/v1/hosts", {"name": "hv9", "vtep_ip": "172.31.0.99", "role": "lb"}, field="role")
    if not adm.get("/v1/eip-pools"):
        adm.post("/v1/eip-pools", {"cidr": "203.0.113.0/24"})
    a, vpc, sn, _ = lb_setup(controller)
    plain, front = a.post("/v1/eips", {}), a.post("/v1/eips", {})
    a.post("/v1/load-balancers", {"name": "pub", "vpc_id": vpc["id"], "subnet_id": sn["id"], "eip_id": front["id"]})
    assert a.get(f"/v1/eips/{plain['id']}")["home"] == "gw1"
    assert a.get(f"/v1/eips/{front['id']}")["home"] == "lb1"
