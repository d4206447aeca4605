"""Stamps are derived from the rows a write changes (controller/state/stamps.py), never said by the write: random
creates, updates and deletes of every kind of object, through the API, and after each one every host's and every gateway
instance's config, as its delta watch brings it, equals its whole config compiled from scratch (the fragment cache
emptied). A row kind whose effect the stamps miss leaves a cached fragment or a delta stale, and fails here."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from controller.southbound.compiler import compile_host
from controller.southbound.fragments import FRAGMENTS
from controller.southbound.gateway_compiler import compile_gateway_sections
from controller.southbound.host_deltas import Asked, compile_host_deltas
from controller.southbound.patches import Sent
from controller.state import models as m
from controller.state.stamps import CHANGES
from tests.conftest import Controller, backends, served
from tianji.host_delta import apply_delta
from tianji.southbound import (
    GatewayConfigDelta,
    GatewayHeld,
    HostConfig,
    HostConfigDelta,
    apply_gateway_delta,
)

HOSTS = ["hv1", "hv2", "hv3"]
GATEWAYS = {"gw-nat": "nat", "gw-lb": "lb", "gw-pl": "private-line", "gw-svc": "service"}


def _diff(a: dict, b: dict) -> str:
    """What differs, key by key (lists of objects by id): for the failure message."""
    out = []
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        if x == y:
            continue
        if isinstance(x, list) and isinstance(y, list) and all(isinstance(e, dict) and "id" in e for e in x + y):
            xi, yi = {e["id"]: e for e in x}, {e["id"]: e for e in y}
            for i in sorted(set(xi) | set(yi)):
                if xi.get(i) != yi.get(i):
                    out.append(f"{k}[{i}]: held {xi.get(i)} / scratch {yi.get(i)}")
        else:
            out.append(f"{k}: held {str(x)[:300]} / scratch {str(y)[:300]}")
    return "; ".join(out)[:3000]


class Fleet:
    """The configs the hosts and gateway instances hold, kept up to date by their delta watches."""

    def __init__(self, c: Controller) -> None:
        self.c = c
        self.hosts: dict[str, HostConfig | None] = dict.fromkeys(HOSTS)
        self.objects: dict[str, HostConfig | None] = dict.fromkeys(HOSTS)  # watching with form=objects
        self.streamed: dict[str, HostConfig | None] = dict.fromkeys(HOSTS)  # as the config stream sends
        self.sent = {h: Sent() for h in HOSTS}  # each stream's record (controller/southbound/patches.py)
        self.gateways: dict[str, GatewayHeld] = {g: GatewayHeld() for g in GATEWAYS}

    def cold(self) -> tuple[dict[str, Any], dict[str, Any]]:
        FRAGMENTS.clear()
        with self.c.db.snapshot() as s:
            hosts = {h: compile_host(s, h) for h in HOSTS}
            gws = {g: (x.config() if (x := compile_gateway_sections(s, g)) else None) for g in GATEWAYS}
        return hosts, gws

    def sync(self, step: str) -> None:
        adm = self.c.admin
        for form, fleet in (("sections", self.hosts), ("objects", self.objects)):
            for h, held in fleet.items():
                body = adm.get(f"/v1/hosts/{h}/config/delta", after=held.revision if held else -1, form=form)
                if body is not None:
                    d = HostConfigDelta.model_validate(body)
                    assert form == "sections" or held is None or d.vteps is None, f"{step}: a whole VTEP list"
                    new = apply_delta(held, d)
                    assert new is not None, f"{step}: {h}'s delta ({form}) did not apply"
                    fleet[h] = new
        with self.c.db.snapshot() as s:  # the streams' compile, in this process, all hosts in one batch
            batch = compile_host_deltas(s, [Asked(h, held.revision if held else -1, "objects", self.sent[h])
                                            for h, held in self.streamed.items()])
        for (h, held), d in zip(list(self.streamed.items()), batch, strict=True):
            assert d is not None
            if held is None or d.revision > held.revision:
                new = apply_delta(held, d)
                assert new is not None, f"{step}: {h}'s streamed delta did not apply"
                self.streamed[h] = new
        for g, held in self.gateways.items():
            body = adm.get(f"/v1/gateways/{g}/config/delta", after=held.revision)
            if body is not None:
                got = apply_gateway_delta(held, GatewayConfigDelta.model_validate(body))
                assert got is not None, f"{step}: {g}'s delta did not apply"
                self.gateways[g] = got[0]
        hosts, gws = self.cold()
        for h in HOSTS:
            for form, got in (("sections", self.hosts[h]), ("objects", self.objects[h]),
                              ("stream", self.streamed[h])):
                want = hosts[h]
                assert got is not None and want is not None
                a, b = got.model_dump(exclude={"revision"}), want.model_dump(exclude={"revision"})
                assert a == b, f"after {step}: host {h}'s config (by its delta watch, {form}) differs from one " \
                               f"compiled from scratch: {_diff(a, b)}"
        for g in GATEWAYS:
            got, want = self.gateways[g].config(), gws[g]
            assert want is not None
            assert got.model_dump(exclude={"revision", "name"}) == want.model_dump(exclude={"revision", "name"}), \
                f"after {step}: gateway {g}'s config (by its delta watch) differs from one compiled from scratch"


@pytest.fixture(params=backends())
def quiet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Controller]:
    """No host or gateway instance here beats: the liveness checker must not move the topology under the test's
    feet between a delta and the compile it is compared with (only the test's own liveness step does)."""
    with served(request.param, tmp_path, host_down_after=3600, gateway_down_after=3600,
                service_network="100.100.0.0/16", service_source_pool="100.100.128.0/17") as c:
        yield c


def test_every_kind_of_write_reaches_every_host_and_gateway(quiet: Controller) -> None:
    controller = quiet
    rng = random.Random(11)
    adm, orch = controller.admin, controller.orchestrator()
    for i, h in enumerate(HOSTS):
        adm.post("/v1/hosts", {"name": h, "vtep_ip": f"172.31.0.{i + 1}"})
    for i, (g, role) in enumerate(GATEWAYS.items()):
        adm.post("/v1/hosts", {"name": g, "vtep_ip": f"172.31.1.{i + 1}", "kind": "gateway", "role": role})
    adm.post("/v1/eip-pools", {"cidr": "198.51.100.0/24"})
    t = controller.tenant()
    t2 = controller.tenant()
    fleet = Fleet(controller)
    vpcs = [t.post("/v1/vpcs", {"name": f"v{v}", "cidr": f"10.{v}.0.0/16"}) for v in range(3)]
    other = t2.post("/v1/vpcs", {"name": "o", "cidr": "10.9.0.0/16"})
    subnets = {v["id"]: [t.post("/v1/subnets", {"vpc_id": v["id"], "name": "s0",
                                                "cidr": v["cidr"].replace("/16", "/24")})] for v in vpcs}
    osub = t2.post("/v1/subnets", {"vpc_id": other["id"], "name": "s0", "cidr": "10.9.0.0/24"})
    fleet.sync("setup")
    objs: dict[str, list] = {k: [] for k in ("ports", "groups", "rules", "routes", "peerings", "eips", "natgws",
                                             "snat", "dnat", "lbs", "listeners", "pools", "members", "monitors",
                                             "lines", "services", "published", "endpoints")}
    n = 0

    def vpc() -> dict:
        return rng.choice(vpcs)

    def sub_of(v: dict) -> dict:
        return rng.choice(subnets[v["id"]])

    def pick(kind: str) -> Any:
        return rng.choice(objs[kind]) if objs[kind] else None

    def take(kind: str) -> Any:
        return objs[kind].pop(rng.randrange(len(objs[kind]))) if objs[kind] else None

    def port_create() -> None:
        v = vpc()
        objs["ports"].append(orch.post("/v1/ports", {"subnet_id": sub_of(v)["id"], "name": f"p{n}",
                                                     "host": rng.choice([*HOSTS, None])}))

    def port_move() -> None:
        if p := pick("ports"):
            orch.patch(f"/v1/ports/{p['id']}", {"host": rng.choice([*HOSTS, None])})

    def port_groups() -> None:
        p = pick("ports")
        gs = [g["id"] for g in objs["groups"] if p and g["vpc_id"] == p["vpc_id"]]
        if p and gs:
            t.patch(f"/v1/ports/{p['id']}", {"security_group_ids": rng.sample(gs, rng.randint(1, len(gs)))})

    def port_delete() -> None:
        p = take("ports")
        if p and t.http.delete(f"/v1/ports/{p['id']}").status_code != 204:
            objs["ports"].append(p)

    def subnet_create() -> None:
        v = vpc()
        k = len(subnets[v["id"]])
        subnets[v["id"]].append(t.post("/v1/subnets", {"vpc_id": v["id"], "name": f"s{n}",
                                                       "cidr": v["cidr"].replace(".0.0/16", f".{k + 10}.0/24")}))

    def subnet_delete() -> None:
        v = vpc()
        if len(subnets[v["id"]]) > 1:
            s = subnets[v["id"]][-1]
            if t.http.delete(f"/v1/subnets/{s['id']}").status_code == 204:
                subnets[v["id"]].pop()

    def group_create() -> None:
        v = vpc()
        objs["groups"].append(t.post("/v1/security-groups", {"vpc_id": v["id"], "name": f"g{n}", "rules": [
            {"direction": "ingress", "protocol": "tcp", "port_range_min": 80, "port_range_max": 80}]}))

    def rule_add() -> None:
        if g := pick("groups"):
            r = t.post(f"/v1/security-groups/{g['id']}/rules", {"direction": "ingress", "protocol": "udp",
                                                               "port_range_min": 1000 + n, "port_range_max": 1000 + n})
            objs["rules"].append((g["id"], r["id"]))

    def rule_delete() -> None:
        if x := take("rules"):
            t.http.delete(f"/v1/security-groups/{x[0]}/rules/{x[1]}")

    def group_delete() -> None:
        g = take("groups")
        if g and t.http.delete(f"/v1/security-groups/{g['id']}").status_code != 204:
            objs["groups"].append(g)
        elif g:
            objs["rules"] = [x for x in objs["rules"] if x[0] != g["id"]]

    def peering() -> None:
        a, b = rng.sample(vpcs, 2)
        r = t.http.post("/v1/peerings", json={"requester_vpc_id": a["id"], "accepter_vpc_id": b["id"]})
        if r.status_code == 201:
            objs["peerings"].append(r.json())
            rr = t.http.post(f"/v1/vpcs/{a['id']}/routes", json={"destination": b["cidr"].replace("/16", "/24"),
                                                                 "target": f"peering:{r.json()['id']}"})
            if rr.status_code == 201:
                objs["routes"].append((a["id"], rr.json()["id"]))

    def cross_peering() -> None:  # another tenant's VPC: pending until it accepts
        a = vpc()
        r = t.http.post("/v1/peerings", json={"requester_vpc_id": a["id"], "accepter_vpc_id": other["id"]})
        if r.status_code == 201:
            t2.post(f"/v1/peerings/{r.json()['id']}/accept")
            objs["peerings"].append(r.json())

    def unpeer() -> None:
        if pc := take("peerings"):
            t.http.delete(f"/v1/peerings/{pc['id']}")

    def route_delete() -> None:
        if x := take("routes"):
            t.http.delete(f"/v1/vpcs/{x[0]}/routes/{x[1]}")

    def eip_associate() -> None:
        p = pick("ports")
        if p:
            e = t.post("/v1/eips", {})
            if t.http.post(f"/v1/eips/{e['id']}/associate", json={"port_id": p["id"]}).status_code == 200:
                objs["eips"].append(e)

    def eip_release() -> None:
        if e := take("eips"):
            t.post(f"/v1/eips/{e['id']}/disassociate")
            t.delete(f"/v1/eips/{e['id']}")

    def natgw() -> None:
        v = vpc()
        if any(g["vpc_id"] == v["id"] for g in objs["natgws"]):
            return
        e = t.post("/v1/eips", {})
        gw = t.post("/v1/nat-gateways", {"vpc_id": v["id"], "eip_ids": [e["id"]]})
        gw["eip"] = e
        objs["natgws"].append(gw)
        objs["snat"].append((gw["id"], t.post(f"/v1/nat-gateways/{gw['id']}/snat-rules",
                                              {"cidr": v["cidr"], "eip_ids": [e["id"]]})["id"]))

    def dnat() -> None:
        gw = pick("natgws")
        ports = [p for p in objs["ports"] if gw and p["vpc_id"] == gw["vpc_id"]]
        if gw and ports:
            e = t.post("/v1/eips", {})
            objs["dnat"].append((gw["id"], t.post(f"/v1/nat-gateways/{gw['id']}/dnat-rules", {
                "eip_id": e["id"], "protocol": "tcp", "external_port": 8000 + n, "port_id": rng.choice(ports)["id"],
                "internal_port": 80})["id"], e["id"]))

    def natgw_delete() -> None:
        gw = take("natgws")
        if gw:
            objs["snat"] = [x for x in objs["snat"] if x[0] != gw["id"]]
            for x in [x for x in objs["dnat"] if x[0] == gw["id"]]:
                t.delete(f"/v1/nat-gateways/{gw['id']}/dnat-rules/{x[1]}")
            objs["dnat"] = [x for x in objs["dnat"] if x[0] != gw["id"]]
            t.delete(f"/v1/nat-gateways/{gw['id']}")

    def lb() -> None:
        v = vpc()
        lb = t.post("/v1/load-balancers", {"name": f"lb{n}", "vpc_id": v["id"], "subnet_id": sub_of(v)["id"]})
        objs["lbs"].append(lb)
        pool = t.post("/v1/pools", {"load_balancer_id": lb["id"], "name": "pl", "protocol": "tcp"})
        objs["pools"].append(pool)
        objs["listeners"].append(t.post(f"/v1/load-balancers/{lb['id']}/listeners",
                                        {"protocol": "tcp", "port": 80, "default_pool_id": pool["id"]}))

    def member() -> None:
        pool = pick("pools")
        lbv = next((x["vpc_id"] for x in objs["lbs"] if pool and x["id"] == pool["load_balancer_id"]), None)
        ports = [p for p in objs["ports"] if p["vpc_id"] == lbv]
        if pool and ports:
            r = t.http.post(f"/v1/pools/{pool['id']}/members", json={"port_id": rng.choice(ports)["id"],
                                                                     "protocol_port": 8080})
            if r.status_code == 201:
                objs["members"].append((pool["id"], r.json()["id"]))

    def member_weight() -> None:
        if x := pick("members"):
            t.patch(f"/v1/pools/{x[0]}/members/{x[1]}", {"weight": rng.choice([0, 1, 5])})

    def monitor() -> None:
        if pool := pick("pools"):
            t.put(f"/v1/pools/{pool['id']}/health-monitor", {"type": "tcp", "interval_s": 5, "timeout_s": 2,
                                                            "rise": 2, "fall": 2})

    def health() -> None:  # the member's host reports it down or up
        x = pick("members")
        if x:
            member = t.get(f"/v1/pools/{x[0]}/members")
            host = next((p["host"] for p in objs["ports"] for mm in member if mm["id"] == x[1]
                         and p["id"] == mm["port_id"]), None)
            if host:
                controller.raw(controller.admin_token).post(f"/v1/hosts/{host}/lb-health", json={
                    "members": {x[1]: rng.choice(["ONLINE", "OFFLINE"])}})

    def lb_delete() -> None:
        published = {p["load_balancer_id"] for p in objs["published"]}
        lb = next((x for x in objs["lbs"] if x["id"] not in published), None)  # a published one: 409
        if lb:
            objs["lbs"].remove(lb)
            pools = {p["id"] for p in objs["pools"] if p["load_balancer_id"] == lb["id"]}
            objs["pools"] = [p for p in objs["pools"] if p["id"] not in pools]
            objs["members"] = [x for x in objs["members"] if x[0] not in pools]
            objs["listeners"] = [x for x in objs["listeners"] if x["load_balancer_id"] != lb["id"]]
            t.delete(f"/v1/load-balancers/{lb['id']}")

    def host_move() -> None:
        h = rng.choice(HOSTS)
        adm.patch(f"/v1/hosts/{h}", {"vtep_ip": f"172.31.2.{rng.randrange(1, 250)}"})

    def host_down_up() -> None:  # liveness: the topology moves
        h = rng.choice(HOSTS)
        with controller.db.write() as w:
            w.session.execute(update(m.Host.__table__).where(m.Host.__table__.c.name == h)
                              .values(last_seen=m.now().replace(year=2000)))
        from controller.southbound.liveness import mark_silent_hosts_down

        mark_silent_hosts_down(controller.db, 60)
        controller.raw(controller.admin_token).post(f"/v1/hosts/{h}/status", json={"ports": {}})

    def gateway_down_up() -> None:  # an instance fails and comes back: its EIPs, buckets and VIPs move twice
        g = rng.choice(list(GATEWAYS))
        with controller.db.write() as w:
            w.session.execute(update(m.Host.__table__).where(m.Host.__table__.c.name == g)
                              .values(last_seen=m.now().replace(year=2000)))
        from controller.southbound.liveness import mark_silent_hosts_down

        mark_silent_hosts_down(controller.db, 60)
        fleet.sync(f"step {n} (gateway {g} down)")
        controller.raw(controller.admin_token).post(f"/v1/hosts/{g}/status", json={"ports": {}})

    def host_join_leave() -> None:  # a hypervisor joins (every VTEP list gains it), or a joined one leaves
        joined = objs.setdefault("joined", [])
        if joined and rng.random() < 0.5:
            adm.delete(f"/v1/hosts/{joined.pop()}")
        else:
            joined.append(f"new{n}")
            adm.post("/v1/hosts", {"name": joined[-1], "vtep_ip": f"172.31.3.{n % 250 + 1}"})

    def line() -> None:
        v = vpc()
        vlan = 100 + n
        objs["lines"].append(t.post("/v1/private-lines", {
            "name": f"l{n}", "vpc_id": v["id"], "vlan_id": vlan, "customer_asn": 65010,
            "customer_ip": f"169.254.{vlan % 250}.2/30", "local_ip": f"169.254.{vlan % 250}.1/30",
            "static_routes": [f"192.168.{n % 250}.0/24"]}))

    def line_update() -> None:
        if x := pick("lines"):
            t.patch(f"/v1/private-lines/{x['id']}", {"static_routes": [f"172.20.{n % 250}.0/24"],
                                                     "max_prefixes": rng.randrange(1, 5)})

    def line_learns() -> None:  # the instance's session reports what BGP brought, or lost
        if x := pick("lines"):
            prefixes = [f"172.{16 + rng.randrange(4)}.{i}.0/24" for i in range(rng.randrange(4))]
            adm.put(f"/v1/gateways/gw-pl/private-lines/{x['id']}", {"sessions": [{
                "local_ip": x["local_ip"], "bgp_state": rng.choice(["Established", "Established", "Active"]),
                "prefixes": prefixes}]})

    def line_delete() -> None:
        if x := take("lines"):
            t.delete(f"/v1/private-lines/{x['id']}")

    def service() -> None:  # the operator's, on the service network
        objs["services"].append(adm.post("/v1/services", {"name": f"svc{n}", "addresses": [f"100.100.0.{n % 250 + 1}"],
                                                          "ports": [{"protocol": "tcp", "port": 80}],
                                                          "proxy_protocol": rng.random() < 0.5}))

    def publish() -> None:  # t's load balancer, for t2
        lb = next((x for x in objs["lbs"] if x["id"] not in {p["load_balancer_id"] for p in objs["published"]}), None)
        if lb:
            objs["published"].append(t.post("/v1/services", {"load_balancer_id": lb["id"], "name": f"pub{n}",
                                                             "allowed_tenants": [other["tenant_id"]]}))

    def consume() -> None:  # t2 consumes t's load balancer: a port of the endpoint's in t's VPC
        if svc := pick("published"):
            r = t2.http.post("/v1/service-endpoints", json={"vpc_id": other["id"], "subnet_id": osub["id"],
                                                            "service_id": svc["id"]})
            if r.status_code == 201:
                objs["endpoints"].append((t2, r.json()))

    def endpoint() -> None:
        if svc := pick("services"):
            v = vpc()
            r = t.http.post("/v1/service-endpoints", json={"vpc_id": v["id"], "subnet_id": sub_of(v)["id"],
                                                           "service_id": svc["id"]})
            if r.status_code == 201:
                objs["endpoints"].append((t, r.json()))

    def endpoint_delete() -> None:
        if x := take("endpoints"):
            x[0].delete(f"/v1/service-endpoints/{x[1]['id']}")

    def service_allow() -> None:  # the owner names who may use it: endpoints of others carry nothing
        if svc := pick("published"):
            t.patch(f"/v1/services/{svc['id']}", {"allowed_tenants": rng.choice([[], [other["tenant_id"]]])})

    def other_tenant() -> None:  # writes elsewhere: nobody's config here changes, nothing may go stale
        orch.post("/v1/ports", {"subnet_id": osub["id"], "name": f"o{n}", "host": rng.choice(HOSTS)})

    ops = [port_create] * 5 + [port_move] * 3 + [port_groups, port_delete, subnet_create, subnet_delete,
                                                   group_create, rule_add, rule_delete, group_delete, peering,
                                                   cross_peering, unpeer, route_delete, eip_associate, eip_release,
                                                   natgw, dnat, natgw_delete, lb, member, member_weight, monitor,
                                                   health, lb_delete, host_move, host_down_up, gateway_down_up,
                                                   host_join_leave, host_join_leave, other_tenant,
                                                   line, line, line_update, line_learns, line_learns, line_delete,
                                                   service, publish, publish, endpoint, endpoint, consume, consume,
                                                   consume, endpoint_delete, service_allow]
    done, served_kinds = set(), set()
    for n in range(200):
        op = rng.choice(ops)
        op()
        done.add(op.__name__)
        fleet.sync(f"step {n} ({op.__name__})")
        served_kinds |= {"published" if x.via_vni else "operator's"
                         for sec in fleet.gateways["gw-svc"].sections.values() for x in sec.services}
    assert len(done) >= len(set(ops)) - 2, sorted({o.__name__ for o in ops} - done)
    assert served_kinds == {"published", "operator's"}, served_kinds  # the service instance's sections were held


def test_a_core_write_the_stamps_cannot_see_is_refused(controller: Controller) -> None:
    t = controller.tenant()
    vpc = t.post("/v1/vpcs", {"name": "v", "cidr": "10.0.0.0/16"})
    with pytest.raises(TypeError, match="unstamped"), controller.db.write(tenants=[t.tenant_id]) as w:
        w.session.execute(update(m.Vpc.__table__).where(m.Vpc.__table__.c.id == vpc["id"]).values(mtu=1400))
    with controller.db.write() as w:  # a column no config reads: allowed
        w.session.execute(update(m.Port.__table__).values(status="DOWN"))
        assert w.session.info[CHANGES].vpcs == set()
