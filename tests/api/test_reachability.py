"""The reachability analyzer (`POST /v1/reachability`) on a controller with data: every verdict kind, the objects
it names, tenant isolation of its answers, and its errors."""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
from typing import Any

import pytest

from tests.support.controller import Controller


def ask(client, src: dict, proto: str = "tcp", port: int | None = None, **dst: str) -> dict:
    body: dict[str, Any] = {"source_port_id": src["id"], "destination": dst, "protocol": proto}
    if port is not None:
        body["port"] = port
    return client.post("/v1/reachability", body)


def steps(answer: dict, leg: str = "forward") -> list[dict]:
    return [s for h in answer[leg]["hops"] for s in h["steps"]]


@pytest.fixture
def net(controller: Controller) -> dict:
    adm, orch = controller.admin, controller.orchestrator()
    for i, h in enumerate(("hv1", "hv2")):
        adm.post("/v1/hosts", {"name": h, "vtep_ip": f"172.31.0.{i + 1}"})
    adm.post("/v1/hosts", {"name": "gw1", "vtep_ip": "172.31.1.1", "kind": "gateway", "role": "nat"})
    adm.post("/v1/eip-pools", {"cidr": "198.51.100.0/24"})
    t, t2 = controller.tenant(), controller.tenant()
    vpc = t.post("/v1/vpcs", {"name": "prod", "cidr": "10.0.0.0/16"})
    web = t.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "web", "cidr": "10.0.1.0/24"})
    db = t.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "db", "cidr": "10.0.2.0/24"})
    dbg = t.post("/v1/security-groups", {"vpc_id": vpc["id"], "name": "db", "rules": [
        {"direction": "ingress", "protocol": "tcp", "port_range_min": 5432, "port_range_max": 5432,
         "remote_cidr": "10.0.1.0/24"}]})
    w1 = orch.post("/v1/ports", {"subnet_id": web["id"], "name": "w1", "host": "hv1"})
    w2 = orch.post("/v1/ports", {"subnet_id": web["id"], "name": "w2", "host": "hv2"})
    d1 = orch.post("/v1/ports", {"subnet_id": db["id"], "name": "d1", "host": "hv2"})
    t.patch(f"/v1/ports/{d1['id']}", {"security_group_ids": [dbg["id"]]})
    other = t2.post("/v1/vpcs", {"name": "other", "cidr": "10.5.0.0/16"})
    osub = t2.post("/v1/subnets", {"vpc_id": other["id"], "name": "s", "cidr": "10.5.1.0/24"})
    x1 = orch.post("/v1/ports", {"subnet_id": osub["id"], "name": "x1", "host": "hv1"})
    return {"t": t, "t2": t2, "vpc": vpc, "web": web, "w1": w1, "w2": w2, "d1": d1, "dbg": dbg, "other": other,
            "x1": x1, "admin": adm}


def test_allowed_names_the_rule_the_route_and_the_hosts(net: dict) -> None:
    t, w1, w2, d1, dbg = net["t"], net["w1"], net["w2"], net["d1"], net["dbg"]
    a = ask(t, w1, "tcp", 22, port_id=w2["id"])
    assert a["verdict"] == "reachable", a
    assert [h["host"] for h in a["forward"]["hops"]] == ["hv1", "hv2"]
    assert a["forward"]["hops"][1]["vni"] == net["vpc"]["vni"]
    assert a["forward"]["delivered_to"] == w2["id"] and a["reply"]["delivered_to"] == w1["id"]
    assert any(s["table"] == "routing" and "same subnet" in s["does"] for s in steps(a))
    ing = [s for s in steps(a) if s["table"] == "ingress_acl"]
    assert ing[0]["object"]["security_group_id"] == net["vpc"]["default_security_group_id"]

    a = ask(t, w1, "tcp", 5432, port_id=d1["id"])
    assert a["verdict"] == "reachable", a
    routed = [s for s in steps(a) if s["table"] == "routing"]
    assert routed[0]["object"]["destination"] == "10.0.0.0/16" and routed[0]["object"]["target_type"] == "local"
    ing = [s for s in steps(a) if s["table"] == "ingress_acl"][0]
    assert ing["object"]["security_group_id"] == dbg["id"] and "tcp/5432 from 10.0.1.0/24" in ing["does"]
    assert [s["table"] for s in steps(a, "reply") if s["table"].endswith("acl")] == ["egress_acl", "ingress_acl"]
    assert all("established" in s["does"] for s in steps(a, "reply") if s["table"].endswith("acl"))


def test_denied_by_a_group_names_the_port_and_its_groups(net: dict) -> None:
    a = ask(net["t"], net["w1"], "tcp", 443, port_id=net["d1"]["id"])
    assert a["verdict"] == "unreachable"
    assert a["forward"]["end"] == "dropped"
    last = steps(a)[-1]
    assert last["table"] == "ingress_acl" and last["object"]["security_group_ids"] == [net["dbg"]["id"]]
    assert "no ingress rule of port d1's security groups ['db']" in a["reason"]  # said by name
    assert "tcp/443 from 10.0.1." in a["reason"]
    assert a["reply"] is None


def test_denied_by_egress_and_by_spoofed_nothing(net: dict) -> None:
    t, w1 = net["t"], net["w1"]
    g = t.post("/v1/security-groups", {"vpc_id": net["vpc"]["id"], "name": "mute", "rules": []})
    t.patch(f"/v1/ports/{w1['id']}", {"security_group_ids": [g["id"]]})
    a = ask(t, w1, "udp", 53, ip=net["w2"]["ip"])
    assert a["verdict"] == "unreachable"
    assert steps(a)[-1]["table"] == "egress_acl" and "no egress rule" in a["reason"]


def test_isolation_other_tenants_are_not_routed_nor_nameable(net: dict) -> None:
    t, w1, x1 = net["t"], net["w1"], net["x1"]
    a = ask(t, w1, "tcp", 80, ip=x1["ip"])
    assert a["verdict"] == "unreachable"
    assert f"no route to {x1['ip']}" in a["reason"]
    assert net["other"]["id"] not in str(a) and x1["id"] not in str(a)
    r = t.http.post("/v1/reachability", json={"source_port_id": w1["id"], "destination": {"port_id": x1["id"]},
                                              "protocol": "tcp", "port": 80})
    assert r.status_code == 404 and r.json()["field"] == "destination.port_id"
    r = net["t2"].http.post("/v1/reachability", json={"source_port_id": w1["id"], "destination": {"ip": "10.0.1.9"},
                                                      "protocol": "icmp"})
    assert r.status_code == 404 and r.json()["field"] == "source_port_id"
    a = ask(t, w1, "tcp", 80, ip="10.0.1.250")  # on the subnet, but no port has it
    assert a["verdict"] == "unreachable" and "ARP for 10.0.1.250 is not answered" in a["reason"]


def test_peering_across_tenants_hides_the_peers_rules(net: dict) -> None:
    t, t2, w1, x1 = net["t"], net["t2"], net["w1"], net["x1"]
    pc = t.post("/v1/peerings", {"requester_vpc_id": net["vpc"]["id"], "accepter_vpc_id": net["other"]["id"]})
    t2.post(f"/v1/peerings/{pc['id']}/accept")
    og = t2.post("/v1/security-groups", {"vpc_id": net["other"]["id"], "name": "from-prod", "rules": [
        {"direction": "ingress", "protocol": "tcp", "port_range_min": 80, "port_range_max": 80,
         "remote_cidr": "10.0.0.0/16"}]})
    t2.patch(f"/v1/ports/{x1['id']}", {"security_group_ids": [og["id"]]})
    a = ask(t, w1, "tcp", 80, ip=x1["ip"])
    assert a["verdict"] == "reachable", a
    route = [s for s in steps(a) if s["table"] == "routing"][0]
    assert route["object"]["target_type"] == "peering" and "into the peer tenant's VPC" in route["does"]
    assert og["id"] not in str(a) and "from-prod" not in str(a), "a tenant sees no rule of the peer's"
    assert any("peer tenant" in s["does"] for s in steps(a))
    full = ask(net["admin"], w1, "tcp", 80, ip=x1["ip"])
    assert any(s["object"] and s["object"].get("security_group_id") == og["id"] for s in steps(full))
    assert ask(t, w1, "tcp", 81, ip=x1["ip"])["verdict"] == "unreachable"


def test_nat_gateway_hop_names_the_instance_and_the_translation(net: dict) -> None:
    t, vpc, w1 = net["t"], net["vpc"], net["w1"]
    eip = t.post("/v1/eips", {})
    gw = t.post("/v1/nat-gateways", {"vpc_id": vpc["id"], "eip_ids": [eip["id"]]})
    t.post(f"/v1/nat-gateways/{gw['id']}/snat-rules", {"subnet_id": net["web"]["id"], "eip_ids": [eip["id"]]})
    a = ask(t, w1, "tcp", 443, ip="8.8.8.8")
    assert a["verdict"] == "unreachable" and "no route to 8.8.8.8" in a["reason"]
    # the missing route is said, the gateway by its name
    assert f"NAT gateway {gw['name']} has no route 0.0.0.0/0 to it" in a["reason"], a["reason"]
    assert "add one with the gateway as its target" in a["reason"]
    t.post(f"/v1/vpcs/{vpc['id']}/routes", {"destination": "0.0.0.0/0", "target": f"nat-gateway:{gw['id']}"})
    a = ask(t, w1, "tcp", 443, ip="8.8.8.8")
    assert a["verdict"] == "reachable", a
    assert a["forward"]["end"] == "left"
    gwhop = a["forward"]["hops"][-1]
    assert (gwhop["host"], gwhop["kind"], gwhop["role"]) == ("gw1", "gateway", "nat")
    assert eip["address"] in gwhop["steps"][-1]["does"]
    t.patch(f"/v1/ports/{net['d1']['id']}", {"security_group_ids": [vpc["default_security_group_id"]]})
    a = ask(t, net["d1"], "tcp", 443, ip="8.8.8.8")  # the db subnet has no SNAT rule
    assert a["verdict"] == "unreachable" and "no SNAT rule" in a["reason"]


@pytest.mark.parametrize("body,field", [
    ({"destination": {"ip": "10.0.0.1"}, "protocol": "tcp", "port": 1}, "source_port_id"),
    ({"source_port_id": "P", "destination": {}, "protocol": "icmp"}, "destination"),
    ({"source_port_id": "P", "destination": {"ip": "10.0.0.1", "port_id": "x"}, "protocol": "icmp"}, "destination"),
    ({"source_port_id": "P", "destination": {"ip": "10.0.0.300"}, "protocol": "icmp"}, "destination.ip"),
    ({"source_port_id": "P", "destination": {"ip": "10.0.0.1"}, "protocol": "tcp"}, "port"),
    ({"source_port_id": "P", "destination": {"ip": "10.0.0.1"}, "protocol": "sctp", "port": 1}, "protocol"),
])
def test_bad_questions_name_the_field(net: dict, body: dict, field: str) -> None:
    r = net["t"].http.post("/v1/reachability", json=body)
    assert r.status_code == 422, r.text
    assert field in r.text


def test_unbound_source_is_a_conflict(net: dict, controller: Controller) -> None:
    p = controller.orchestrator().post("/v1/ports", {"subnet_id": net["web"]["id"], "name": "loose"})
    r = net["t"].http.post("/v1/reachability", json={"source_port_id": p["id"], "destination": {"ip": "10.0.1.9"},
                                                     "protocol": "icmp"})
    assert r.status_code == 409 and r.json()["field"] == "source_port_id"


def test_tianji_trace_takes_names_and_says_the_verdict_in_its_exit_status(net: dict, controller: Controller) -> None:
    from typer.testing import CliRunner

    from tianjictl.main import _register_components, app

    _register_components()

    def tianji(*args: str) -> tuple[int, str]:
        r = CliRunner().invoke(app, ["--url", controller.url, "--token", net["t"].token, *args],
                               env={"COLUMNS": "200"})
        return r.exit_code, r.output

    code, out = tianji("trace", "w1", "d1", "--proto", "tcp", "--port", "5432")
    assert code == 0, out
    assert out.startswith("REACHABLE") and "hv2" in out and "security group db:" in out, out
    code, out = tianji("trace", "w1", "d1", "--port", "443")
    assert code == 8 and out.startswith("UNREACHABLE") and "x ingress_acl" in out, out
    code, out = tianji("trace", "w1", "8.8.8.8", "--port", "443", "-o", "json")
    assert code == 8 and json.loads(out)["forward"]["end"] == "dropped", out
    code, out = tianji("trace", "nosuch", "10.0.1.3", "--proto", "icmp")
    assert code == 3 and "source: no port named 'nosuch'" in out, out
    code, out = tianji("trace", "w1", "nowhere")  # neither a port nor an address
    assert code == 3 and "destination: no port named 'nowhere'" in out, out
    code, out = tianji("trace", "w1", "d1")  # no --port: ICMP
    assert code in (0, 8) and " icmp: " in out.splitlines()[0], out
    code, out = tianji("trace", "w1", "d1", "--proto", "udp")
    assert code == 2 and "--port is needed for udp" in out, out


def test_live_asks_the_source_hosts_switch_through_its_stream(net: dict, controller: Controller) -> None:
    """The agent's side played by the test: it hears the `trace` event on hv1's stream and answers as Open vSwitch
    would (a tunnel to hv2's VTEP; then, for the second question, a drop: the switch disagrees)."""
    import threading

    token = controller.host_token("hv1")
    answers = iter(["  -> tunneling to 172.31.0.2 via br-phy\nDatapath actions: tnl_push(...)\n",
                    "Datapath actions: drop\n"])
    heard: list[dict] = []
    stop = threading.Event()

    def agent() -> None:
        with controller.raw(token) as c, c.stream("GET", "/v1/hosts/hv1/config/stream",
                                                  params={"form": "objects", "keepalive": 0.5}) as r:
            event = ""
            for line in r.iter_lines():
                if stop.is_set():
                    return
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:") and event == "trace":
                    q = json.loads(line[5:])
                    heard.append(q)
                    c.put(f"/v1/hosts/hv1/traces/{q['id']}", json={"output": next(answers), "ofports": {}})

    th = threading.Thread(target=agent, daemon=True)
    th.start()
    try:
        body = {"source_port_id": net["w1"]["id"], "destination": {"ip": net["w2"]["ip"]}, "protocol": "tcp",
                "port": 22, "live": True}
        a = controller.admin.post("/v1/reachability", body)
        assert a["live"]["agrees"] is True and a["live"]["switch"] == "tunnelled to VTEP 172.31.0.2", a["live"]
        assert heard[0]["port_id"] == net["w1"]["id"] and heard[0]["packet"]["tcp_dst"] == 22
        a = controller.admin.post("/v1/reachability", body)
        assert a["live"]["agrees"] is False and a["live"]["note"].startswith("the switch disagrees")
    finally:
        stop.set()
    r = net["t"].http.post("/v1/reachability", json=body)
    assert r.status_code == 403 and r.json()["field"] == "live"


def test_a_question_put_before_the_agent_connected_reaches_it_once(net: dict, controller: Controller) -> None:
    """A live trace asked while hv1's agent is between connections (it reconnects, or the question races its
    connect) still goes out, when the stream opens; a wake after that does not send it a second time."""
    import threading
    import time

    token = controller.host_token("hv1")
    body = {"source_port_id": net["w1"]["id"], "destination": {"ip": net["w2"]["ip"]}, "protocol": "tcp",
            "port": 22, "live": True}
    answer: dict = {}
    asker = threading.Thread(target=lambda: answer.update(controller.admin.post("/v1/reachability", body)))
    asker.start()
    time.sleep(1.0)  # the question is in the table; no stream is open for hv1
    heard: list[str] = []
    with controller.raw(token) as c, c.stream("GET", "/v1/hosts/hv1/config/stream",
                                              params={"form": "objects", "keepalive": 0.3}) as r:
        event, t0 = "", time.monotonic()
        for line in r.iter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:") and event == "trace":
                q = json.loads(line[5:])
                heard.append(q["id"])
                c.put(f"/v1/hosts/hv1/traces/{q['id']}", json={"output": "Datapath actions: drop\n", "ofports": {}})
            if time.monotonic() - t0 > 3.0:  # a few keep-alives and the answer's own wake after the answer
                break
    asker.join(10)
    assert len(heard) == 1, heard
    assert answer["live"]["switch"] == "dropped" and answer["live"]["agrees"] is False, answer["live"]


def _peer_world(controller: Controller, asker: Any, asker_vpc: dict, name: str) -> tuple[dict, dict, str]:
    """A peer tenant with a VPC of `name`, 10.40.0.0/16, whose port (on hv2, at 10.40.1.10) takes tcp/80 only, peered
    with the asker's VPC; returns (its port, its objects' names and ids, the peering id)."""
    peer, orch = controller.tenant(f"t-{name}"), controller.orchestrator()
    vpc = peer.post("/v1/vpcs", {"name": name, "cidr": "10.40.0.0/16"})
    sub = peer.post("/v1/subnets", {"vpc_id": vpc["id"], "name": f"{name}-net", "cidr": "10.40.1.0/24"})
    sg = peer.post("/v1/security-groups", {"vpc_id": vpc["id"], "name": f"{name}-web", "rules": [
        {"direction": "ingress", "protocol": "tcp", "port_range_min": 80, "port_range_max": 80,
         "remote_cidr": "0.0.0.0/0"}]})
    port = orch.post("/v1/ports", {"subnet_id": sub["id"], "name": f"{name}-vm", "host": "hv2", "ip": "10.40.1.10",
                                   "mac": "02:00:00:40:01:0a"})
    peer.patch(f"/v1/ports/{port['id']}", {"security_group_ids": [sg["id"]]})
    pc = asker.post("/v1/peerings", {"requester_vpc_id": asker_vpc["id"], "accepter_vpc_id": vpc["id"]})
    peer.post(f"/v1/peerings/{pc['id']}/accept")
    secrets = [name, f"{name}-net", f"{name}-web", f"{name}-vm", f"t-{name}", peer.tenant_id, vpc["id"], sub["id"],
               sg["id"], port["id"], vpc["default_security_group_id"], f"VNI {vpc['vni']}", f'"vni": {vpc["vni"]}']
    return port, {"vpc": vpc, "peer": peer, "secrets": secrets}, pc["id"]


def _drop_peer(asker: Any, world: dict, peering: str, port: dict, controller: Controller) -> None:
    asker.delete(f"/v1/peerings/{peering}")
    controller.orchestrator().delete(f"/v1/ports/{port['id']}")


QUESTIONS = [("tcp", 22), ("tcp", 80), ("icmp", None), ("udp", 53)]


def test_the_peer_tenants_part_of_an_answer_names_nothing_of_the_peer(net: dict, controller: Controller) -> None:
    """The same questions against two peers whose objects have other names and ids: the answers are byte-identical
    once the asker's own peering id is set aside, and name nothing of either peer (reasons, legs, hops, steps)."""
    t, w1 = net["t"], net["w1"]
    answers = []
    for name in ("staging", "qa-blue"):
        port, world, pc = _peer_world(controller, t, net["vpc"], name)
        got = {}
        for proto, dport in QUESTIONS:
            a = ask(t, w1, proto, dport, ip="10.40.1.10")
            text = json.dumps(a)
            for secret in world["secrets"]:
                assert secret not in text, (secret, a)
            got[(proto, dport)] = text.replace(pc, "PEERING")
        answers.append(got)
        whole = ask(net["admin"], w1, "tcp", 22, ip="10.40.1.10")
        assert f"{name}-vm" in whole["reason"] or port["id"] in json.dumps(whole), "the admin sees the peer's objects"
        _drop_peer(t, world, pc, port, controller)
    assert answers[0] == answers[1]
    a = json.loads(answers[0][("tcp", 22)])
    assert a["verdict"] == "unreachable"
    assert a["reason"] == "decided by the peer tenant's configuration: dropped", a["reason"]
    assert a["forward"]["reason"] == a["reason"] and a["forward"]["delivered_to"] is None
    assert [h["host"] for h in a["forward"]["hops"]] == ["hv1", "(the peer tenant's host)"]
    assert a["forward"]["hops"][1]["vni"] is None
    b = json.loads(answers[0][("tcp", 80)])
    assert b["verdict"] == "reachable", b
    assert b["reason"] == "decided by the peer tenant's configuration: delivered; the reply returns"
    assert b["reply"]["delivered_to"] == w1["id"]  # the asker's own port, named


def test_a_foreign_address_answers_as_a_missing_one_without_a_peering(net: dict, controller: Controller) -> None:
    """A tenant that has no peering learns nothing from an address: another tenant's port's answers as an
    address nobody has, whether the asker's CIDR differs from the other's or overlaps it, routed or NATed."""
    t2, x1 = net["t2"], net["x1"]  # x1: 10.5.1.x, in t2's VPC, on hv1
    t = net["t"]
    lone = t.post("/v1/vpcs", {"name": "lone", "cidr": "10.5.0.0/16"})  # the same CIDR as t2's
    sub = t.post("/v1/subnets", {"vpc_id": lone["id"], "name": "lone", "cidr": "10.5.1.0/24"})
    me = controller.orchestrator().post("/v1/ports", {"subnet_id": sub["id"], "name": "me", "host": "hv1",
                                                      "ip": "10.5.1.200"})
    missing = str(ipaddress.IPv4Address(x1["ip"]) + 100)
    for src in (net["w1"], me):
        for proto, dport in QUESTIONS:
            there, nobody = (ask(t, src, proto, dport, ip=ip) for ip in (x1["ip"], missing))
            a, b = (re.sub(re.escape(ip) + r"(?!\d)", "X", json.dumps(x)) for x, ip in ((there, x1["ip"]),
                                                                                           (nobody, missing)))
            assert a == b, "\n".join(difflib.unified_diff(a.split(", "), b.split(", "), lineterm=""))
            assert x1["id"] not in json.dumps(there) and net["other"]["id"] not in json.dumps(there)
    assert t2.get(f"/v1/ports/{x1['id']}")["ip"] == x1["ip"]


def test_tianji_trace_from_the_peers_side_names_nothing_of_the_peer(net: dict, controller: Controller) -> None:
    from typer.testing import CliRunner

    from tianjictl.main import _register_components, app

    _register_components()
    port, world, _pc = _peer_world(controller, net["t"], net["vpc"], "staging")
    r = CliRunner().invoke(app, ["--url", controller.url, "--token", net["t"].token, "trace", "w1", "10.40.1.10",
                                 "--port", "22"], env={"COLUMNS": "200"})
    assert r.exit_code == 8 and r.output.startswith("UNREACHABLE"), r.output
    assert "decided by the peer tenant's configuration: dropped" in r.output, r.output
    for secret in world["secrets"]:
        assert secret not in r.output, (secret, r.output)
