"""Credentials: a host token acts for its own host only; orchestrators bind ports; tokens rotate and revoke."""

from __future__ import annotations

from controller.auth import token_hash
from controller.state import models as m
from tests.conftest import Controller


def test_a_host_token_acts_for_its_own_host_only(controller: Controller) -> None:
    adm = controller.admin
    adm.post("/v1/hosts", {"name": "hv2", "vtep_ip": "172.31.0.2"})
    adm.post("/v1/hosts", {"name": "gw1", "vtep_ip": "172.31.0.9", "kind": "gateway"})
    h = controller.raw(controller.host_token("hv1"))
    assert h.post("/v1/hosts", json={"name": "hv1", "vtep_ip": "172.31.0.1"}).status_code == 200
    assert h.post("/v1/hosts", json={"name": "hv1", "vtep_ip": "172.31.0.1"}).status_code == 200  # idempotent
    assert h.post("/v1/hosts/hv1/status", json={"ports": {}}).status_code == 200
    assert h.get("/v1/hosts/hv1/config").status_code == 200
    assert h.get("/v1/hosts/hv1/config/delta").status_code == 200
    assert [x["name"] for x in h.get("/v1/hosts").json()] == ["hv1"]
    refused = [
        h.get("/v1/hosts/hv2/config"),                                        # another hypervisor's tenants
        h.get("/v1/hosts/hv2/config/delta"),
        h.get("/v1/gateways/gw1/config"),                                     # every tenant's NAT rules
        h.get("/v1/gateways/gw1/config/delta"),
        h.post("/v1/hosts/hv2/status", json={"ports": {}}),                   # another host's ports UP/DOWN
        h.post("/v1/hosts", json={"name": "hv2", "vtep_ip": "172.31.0.66"}),  # another host's VTEP
        h.post("/v1/hosts", json={"name": "hv1", "vtep_ip": "172.31.0.1", "kind": "gateway"}),  # another kind
        h.post("/v1/hosts", json={"name": "hv1", "vtep_ip": "172.31.0.77"}),  # its own VTEP, moved
        h.get("/v1/hosts/hv2"),
        h.get("/v1/ports"),
        h.post("/v1/host-tokens", json={"host": "hv3"}),
    ]
    for r in refused:
        assert r.status_code == 403, (r.request.url, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
    assert adm.get("/v1/hosts/hv2")["vtep_ip"] == "172.31.0.2"
    assert adm.get("/v1/hosts/hv1")["vtep_ip"] == "172.31.0.1"
    # the operator moves the VTEP; the agent then registers with it
    assert adm.patch("/v1/hosts/hv1", {"vtep_ip": "172.31.0.77"})["vtep_ip"] == "172.31.0.77"
    assert h.post("/v1/hosts", json={"name": "hv1", "vtep_ip": "172.31.0.77"}).status_code == 200
    r = controller.raw(controller.admin_token).patch("/v1/hosts/hv1", json={"vtep_ip": "172.31.0.2"})
    assert r.status_code == 409 and r.json()["field"] == "vtep_ip"  # hv2's
    # a registered host keeps its kind, whoever asks
    r = controller.raw(controller.admin_token).post("/v1/hosts", json={"name": "hv2", "vtep_ip": "172.31.0.2",
                                                                       "kind": "gateway"})
    assert r.status_code == 409 and r.json()["field"] == "kind"


def test_a_gateway_token_reads_its_own_gateway_config_only(controller: Controller) -> None:
    g = controller.raw(controller.host_token("gw1", "gateway"))
    assert g.post("/v1/hosts", json={"name": "gw1", "vtep_ip": "172.31.0.9", "kind": "gateway"}).status_code == 200
    assert g.get("/v1/gateways/gw1/config/delta").status_code == 200
    controller.admin.post("/v1/hosts", {"name": "gw2", "vtep_ip": "172.31.0.10", "kind": "gateway"})
    assert g.get("/v1/gateways/gw2/config").status_code == 403
    assert g.get("/v1/hosts/gw1/config").status_code == 403  # a gateway is not a hypervisor
    # a hypervisor's token cannot join as a gateway (and be handed EIPs)
    h = controller.raw(controller.host_token("hv9"))
    assert h.post("/v1/hosts", json={"name": "hv9", "vtep_ip": "172.31.0.99", "kind": "gateway"}).status_code == 403


def test_host_token_made_before_hosts_were_named_is_refused(controller: Controller) -> None:
    with controller.db.write() as t:
        t.session.add(m.HostToken(name="old-agents", token_hash=token_hash("tjh_legacy"), host=None))
    r = controller.raw("tjh_legacy").post("/v1/hosts", json={"name": "hv1", "vtep_ip": "172.31.0.1"})
    assert r.status_code == 403 and "POST /v1/host-tokens" in r.json()["detail"]


def test_ports_are_bound_by_the_orchestrator_not_the_tenant(controller: Controller) -> None:
    controller.admin.post("/v1/hosts", {"name": "hv1", "vtep_ip": "172.31.0.1"})
    a, b = controller.tenant(), controller.tenant()
    vpc = a.post("/v1/vpcs", {"name": "v", "cidr": "10.0.0.0/16"})
    sn = a.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.0.1.0/24"})
    port = a.post("/v1/ports", {"subnet_id": sn["id"], "name": "vm"})
    ta = controller.raw(a.http.headers["Authorization"].split()[1])
    r = ta.patch(f"/v1/ports/{port['id']}", json={"host": "hv1"})
    assert r.status_code == 403 and r.json()["field"] == "host"
    r = ta.post("/v1/ports", json={"subnet_id": sn["id"], "name": "vm2", "host": "hv1"})
    assert r.status_code == 403 and r.json()["field"] == "host"
    o = controller.orchestrator()
    assert o.patch(f"/v1/ports/{port['id']}", {"host": "hv1"})["host"] == "hv1"
    assert a.get(f"/v1/ports/{port['id']}")["host"] == "hv1"
    assert {p["id"] for p in o.get("/v1/ports")} == {port["id"]}  # it sees every tenant's ports ...
    assert [h["name"] for h in o.get("/v1/hosts")] == ["hv1"]  # ... and the hosts it places them on
    ot = controller.raw(o.http.headers["Authorization"].split()[1])
    for r in (ot.patch(f"/v1/ports/{port['id']}", json={"name": "renamed"}),  # ... but changes nothing else
              ot.get("/v1/vpcs"), ot.post("/v1/vpcs", json={"name": "x", "cidr": "10.9.0.0/16"}),
              ot.get(f"/v1/security-groups/{vpc['default_security_group_id']}"),
              ot.post("/v1/hosts", json={"name": "hv1", "vtep_ip": "172.31.0.1"}),
              ot.get("/v1/hosts/hv1/config"), ot.post("/v1/tenants", json={"name": "x"})):
        assert r.status_code == 403, (r.request.url, r.text)
    # another tenant still cannot see it
    assert controller.raw(b.http.headers["Authorization"].split()[1]).get(f"/v1/ports/{port['id']}").status_code == 404


def test_tokens_rotate_and_revoke(controller: Controller) -> None:
    a = controller.tenant()
    tid = a.tenant_id
    old = a.http.headers["Authorization"].split()[1]
    new = a.post(f"/v1/tenants/{tid}/tokens", {"name": "ci"})
    assert new["token"] != old and new["name"] == "ci"
    assert controller.raw(new["token"]).get("/v1/vpcs").status_code == 200
    tokens = a.get(f"/v1/tenants/{tid}/tokens")
    assert [t["name"] for t in tokens] == ["initial", "ci"] and all("token" not in t for t in tokens)
    initial = next(t for t in tokens if t["name"] == "initial")
    controller.raw(new["token"]).delete(f"/v1/tenants/{tid}/tokens/{initial['id']}")
    assert controller.raw(old).get("/v1/vpcs").status_code == 401  # revoked, at once in this process
    assert controller.raw(new["token"]).get("/v1/vpcs").status_code == 200
    # another tenant cannot list or revoke them
    other = controller.tenant()
    r = controller.raw(other.http.headers["Authorization"].split()[1]).get(f"/v1/tenants/{tid}/tokens")
    assert r.status_code == 404
    # host tokens: a second one for the same host, then the first revoked
    first = controller.admin.post("/v1/host-tokens", {"host": "hv1"})
    second = controller.admin.post("/v1/host-tokens", {"host": "hv1", "name": "hv1-2"})
    assert second["host"] == "hv1" and second["kind"] == "hypervisor"
    listed = {t["name"]: t for t in controller.admin.get("/v1/host-tokens")}
    assert set(listed) == {"hv1", "hv1-2"} and all("token" not in t for t in listed.values())
    body = {"name": "hv1", "vtep_ip": "172.31.0.1"}
    assert controller.raw(first["token"]).post("/v1/hosts", json=body).status_code == 200
    controller.admin.delete(f"/v1/host-tokens/{first['id']}")
    assert controller.raw(first["token"]).post("/v1/hosts", json=body).status_code == 401
    assert controller.raw(second["token"]).post("/v1/hosts", json=body).status_code == 200
    r = controller.raw(controller.admin_token).post("/v1/host-tokens", json={"host": "hv1", "name": "hv1-2"})
    assert r.status_code == 409 and r.json()["field"] == "name"


def test_macs_are_unique_per_vpc_only(controller: Controller) -> None:
    a, b = controller.tenant(), controller.tenant()
    nets = []
    for t in (a, b):
        vpc = t.post("/v1/vpcs", {"name": "v", "cidr": "10.0.0.0/16"})
        nets.append(t.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.0.1.0/24"}))
    mac = "02:aa:bb:cc:dd:ee"
    a.post("/v1/ports", {"subnet_id": nets[0]["id"], "name": "p", "mac": mac})
    # another tenant learns nothing about it and is not in its way
    assert b.post("/v1/ports", {"subnet_id": nets[1]["id"], "name": "p", "mac": mac})["mac"] == mac
    r = controller.raw(a.http.headers["Authorization"].split()[1]).post(
        "/v1/ports", json={"subnet_id": nets[0]["id"], "name": "q", "mac": mac})
    assert r.status_code == 409 and r.json()["field"] == "mac"
    for bad in ("00:00:00:00:00:00", "ff:ff:ff:ff:ff:ff", "01:00:5e:00:00:01"):
        r = controller.raw(a.http.headers["Authorization"].split()[1]).post(
            "/v1/ports", json={"subnet_id": nets[0]["id"], "name": "q", "mac": bad})
        assert r.status_code == 422 and r.json()["field"] == "mac", bad


def test_a_new_host_registered_by_many_requests_at_once_is_registered_once(controller: Controller) -> None:
    """An agent's registration retried while the first is still in flight (a cold start of a thousand agents):
    every attempt answers 200 with the same host, whichever inserted it; a VTEP taken meanwhile is still a 409."""
    from concurrent.futures import ThreadPoolExecutor

    tok = controller.host_token("hv7")
    clients = [controller.raw(tok) for _ in range(8)]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda c: c.post("/v1/hosts", json={"name": "hv7", "vtep_ip": "172.31.0.7"}), clients))
    assert [r.status_code for r in got] == [200] * 8, [r.text for r in got]
    assert {r.json()["vtep_ip"] for r in got} == {"172.31.0.7"}
    assert [h["name"] for h in controller.admin.get("/v1/hosts")] == ["hv7"]
    other = controller.raw(controller.host_token("hv8")).post("/v1/hosts", json={"name": "hv8",
                                                                                  "vtep_ip": "172.31.0.7"})
    assert other.status_code == 409 and "vtep_ip" in other.text
