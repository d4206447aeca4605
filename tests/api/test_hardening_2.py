"""Hardening II: each finding of the second review, on both backends; each of these failed before its fix."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Controller, backends, served

LEAKS = ("sql", "violates", "foreign key", "constraint", "psycopg", "sqlite", "insert into", "delete from")


def token_of(client) -> str:
    return client.http.headers["Authorization"].split()[1]


def no_leak(r: httpx.Response) -> None:
    assert not any(w in r.text.lower() for w in LEAKS), r.text


def network(c: Controller, admin_pool: bool = True) -> tuple:
    a = c.tenant()
    vpc = a.post("/v1/vpcs", {"name": "v", "cidr": "10.70.0.0/16"})
    sn = a.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.70.1.0/24"})
    if admin_pool:
        c.raw(c.admin_token).post("/v1/eip-pools", json={"cidr": "198.51.100.0/24"})
    return a, vpc, sn


@pytest.mark.parametrize("vip", ["not-an-ip", "fd00::1", "10.70.1.300", "", "²"])
def test_an_invalid_vip_address_is_a_422_naming_it(controller: Controller, vip: str) -> None:
    a, vpc, sn = network(controller, admin_pool=False)
    before = controller.snapshot()
    r = controller.raw(token_of(a)).post("/v1/load-balancers", json={"name": "lb", "vpc_id": vpc["id"],
                                                                     "subnet_id": sn["id"], "vip_address": vip})
    assert r.status_code == 422 and r.json()["field"] == "vip_address", r.text
    assert controller.snapshot() == before


def test_integers_are_bounded_by_their_columns(controller: Controller) -> None:
    a, vpc, sn = network(controller, admin_pool=False)
    h, admin = controller.raw(token_of(a)), controller.raw(controller.admin_token)
    g = a.post("/v1/security-groups", {"vpc_id": vpc["id"], "name": "g"})
    for rid in (2**31, 2**63, 2**64, 0, -1):
        r = h.delete(f"/v1/security-groups/{g['id']}/rules/{rid}")
        assert r.status_code == 422 and r.json()["field"] == "rule_id", (rid, r.text)
    for n in (2**31, 2**63):
        r = admin.put(f"/v1/tenants/{a.tenant_id}/quotas", json={"ports": n})
        assert r.status_code == 422 and r.json()["field"] == "ports", r.text
    admin.post("/v1/vpcs", json={"name": "w", "cidr": "10.1.0.0/16", "tenant_id": a.tenant_id})
    for marker in ("²", "٣", str(2**63), str(2**64), "-1"):
        r = admin.get("/v1/audit", params={"marker": marker})
        assert r.status_code == 404 and r.json()["field"] == "marker", (marker, r.text)
    r = h.post("/v1/vpcs", json={"name": "x", "cidr": "10.2.0.0/16", "mtu": 2**63})
    assert r.status_code == 422 and r.json()["field"] == "mtu"
    r = admin.get("/v1/hosts/hv1/config", params={"after": 2**63, "timeout": 0})
    assert r.status_code == 422 and r.json()["field"] == "after"


def test_snat_eips_are_rows_in_order_and_repeats_are_refused(controller: Controller) -> None:
    a, vpc, sn = network(controller)
    h = controller.raw(token_of(a))
    eips = [a.post("/v1/eips", {}) for _ in range(28)]
    ids = [e["id"] for e in eips]
    gw = a.post("/v1/nat-gateways", {"vpc_id": vpc["id"], "eip_ids": ids})
    r = h.post(f"/v1/nat-gateways/{gw['id']}/snat-rules", json={"subnet_id": sn["id"], "eip_ids": ids[::-1]})
    assert r.status_code == 201, r.text  # 28 ids: 1,036 characters, a 500 on PostgreSQL before
    assert a.get(f"/v1/nat-gateways/{gw['id']}/snat-rules")[0]["eip_ids"] == ids[::-1]
    before = controller.snapshot()
    for path, body in ((f"/v1/nat-gateways/{gw['id']}/snat-rules", {"cidr": "10.70.2.0/24", "eip_ids": [ids[0]] * 40}),
                       ("/v1/nat-gateways", {"vpc_id": vpc["id"], "name": "n2", "eip_ids": [ids[1], ids[1]]})):
        r = h.post(path, json=body)
        assert r.status_code == 422 and r.json()["field"] == "eip_ids" and "more than once" in r.text, r.text
    assert controller.snapshot() == before
    # the gateway's config names them in the rule's order (what paired pooling hashes over)
    controller.admin.post("/v1/hosts", {"name": "gw1", "vtep_ip": "192.0.2.21", "kind": "gateway"})
    cfg = controller.admin.get("/v1/gateways/gw1/config", timeout=0)
    rules = [r for v in cfg["vpcs"] for r in v["snat"]]
    addr = {e["id"]: e["address"] for e in eips}
    assert rules and rules[0]["eips"] == [addr[i] for i in ids[::-1]]


def test_tokens_are_capped_by_quota_and_rate_is_per_tenant(tmp_path: Path) -> None:
    for backend in backends():
        with served(backend, tmp_path / backend, rate_limit=10, rate_burst=20,
                    quotas={"tokens": 3}) as c:
            a = c.tenant()
            tid = a.tenant_id
            extra = [a.post(f"/v1/tenants/{tid}/tokens", {"name": f"t{i}"})["token"] for i in range(2)]
            r = c.raw(token_of(a)).post(f"/v1/tenants/{tid}/tokens", json={"name": "t9"})
            assert r.status_code == 409 and r.json()["field"] == "tokens", r.text
            # three tokens of one tenant share one budget: 3 x 15 requests at once is over a burst of 20
            clients = [c.raw(t) for t in [token_of(a), *extra]]
            codes = [cl.get("/v1/vpcs").status_code for _ in range(15) for cl in clients]
            assert codes.count(429) >= 15, codes
            assert c.raw(token_of(c.tenant())).get("/v1/vpcs").status_code == 200  # another tenant: its own


def test_every_quota_listed_can_be_set(controller: Controller) -> None:
    a = controller.tenant()
    listed = controller.admin.get(f"/v1/tenants/{a.tenant_id}/quotas")
    assert {"load_balancers", "tokens"} <= set(listed)
    got = controller.admin.put(f"/v1/tenants/{a.tenant_id}/quotas", {r: 7 for r in listed})
    assert {r: q["limit"] for r, q in got.items()} == {r: 7 for r in listed}


def test_nul_in_a_json_objects_keys_is_refused(controller: Controller) -> None:
    controller.admin.post("/v1/hosts", {"name": "hv1", "vtep_ip": "192.0.2.11"})
    h = controller.raw(controller.host_token("hv1"))
    r = h.post("/v1/hosts/hv1/lb-health", json={"members": {"a\x00b": "ONLINE"}})
    assert r.status_code == 422 and r.json()["field"] == "members", r.text
    r = h.post("/v1/hosts/hv1/status", json={"ports": {"p\x00": "UP"}})
    assert r.status_code == 422, r.text


def test_deletes_blocked_by_references_say_what_blocks_them(controller: Controller) -> None:
    a, vpc, sn = network(controller)
    h = controller.raw(token_of(a))
    e1, e2 = a.post("/v1/eips", {}), a.post("/v1/eips", {})
    gw = a.post("/v1/nat-gateways", {"vpc_id": vpc["id"], "eip_ids": [e1["id"]]})
    a.post(f"/v1/nat-gateways/{gw['id']}/snat-rules", {"subnet_id": sn["id"], "eip_ids": [e1["id"]]})
    lb = a.post("/v1/load-balancers", {"name": "lb", "vpc_id": vpc["id"], "subnet_id": sn["id"]})
    a.post(f"/v1/eips/{e2['id']}/associate", {"port_id": lb["vip_port_id"]})
    r = h.delete(f"/v1/load-balancers/{lb['id']}")
    assert r.status_code == 409 and e2["address"] in r.json()["detail"] and "disassociate" in r.json()["detail"]
    no_leak(r)
    a.post(f"/v1/eips/{e2['id']}/disassociate")
    a.delete(f"/v1/load-balancers/{lb['id']}")
    r = h.delete(f"/v1/subnets/{sn['id']}")
    assert r.status_code == 409 and "SNAT rule" in r.json()["detail"] and gw["id"] in r.json()["detail"], r.text
    no_leak(r)
    rule = a.get(f"/v1/nat-gateways/{gw['id']}/snat-rules")[0]
    a.delete(f"/v1/nat-gateways/{gw['id']}/snat-rules/{rule['id']}")
    a.delete(f"/v1/subnets/{sn['id']}")
    r = h.delete(f"/v1/vpcs/{vpc['id']}")
    assert r.status_code == 409 and "NAT gateway" in r.json()["detail"] and gw["id"] in r.json()["detail"], r.text
    no_leak(r)
    a.delete(f"/v1/nat-gateways/{gw['id']}")
    a.delete(f"/v1/vpcs/{vpc['id']}")


@pytest.mark.parametrize("vtep", ["0.0.0.0", "255.255.255.255", "224.0.0.1", "239.1.2.3", "127.0.0.1", "0.1.2.3",
                                  "169.254.1.1", "240.0.0.1"])
def test_vtep_addresses_are_unicast(controller: Controller, vtep: str) -> None:
    admin = controller.raw(controller.admin_token)
    r = admin.post("/v1/hosts", json={"name": "hv1", "vtep_ip": vtep})
    assert r.status_code == 422 and r.json()["field"] == "vtep_ip", r.text
    admin.post("/v1/hosts", json={"name": "hv2", "vtep_ip": "192.0.2.12"})
    r = admin.patch("/v1/hosts/hv2", json={"vtep_ip": vtep})
    assert r.status_code == 422 and r.json()["field"] == "vtep_ip", r.text


def test_a_gateway_credential_is_bound_to_its_role(controller: Controller) -> None:
    a, vpc, sn = network(controller, admin_pool=False)
    a.post("/v1/load-balancers", {"name": "lb", "vpc_id": vpc["id"], "subnet_id": sn["id"]})
    nat = controller.raw(controller.host_token("gw1", "gateway"))
    assert nat.post("/v1/hosts", json={"name": "gw1", "vtep_ip": "192.0.2.21", "kind": "gateway"}).status_code == 200
    r = nat.post("/v1/hosts", json={"name": "gw1", "vtep_ip": "192.0.2.21", "kind": "gateway", "role": "lb"})
    assert r.status_code == 403 and r.json()["field"] == "role", r.text
    assert controller.admin.get("/v1/hosts/gw1")["role"] == "nat"
    assert nat.get("/v1/gateways/gw1/config", params={"timeout": 0}).json()["vpcs"] == []  # no VIPs, no members
    # a credential made for a role registers with that role only
    tok = controller.admin.post("/v1/host-tokens", {"host": "gw2", "kind": "gateway", "role": "lb"})["token"]
    lb = controller.raw(tok)
    r = lb.post("/v1/hosts", json={"name": "gw2", "vtep_ip": "192.0.2.22", "kind": "gateway", "role": "nat"})
    assert r.status_code == 403 and r.json()["field"] == "role"
    assert lb.post("/v1/hosts", json={"name": "gw2", "vtep_ip": "192.0.2.22", "kind": "gateway"}).json()["role"] == "lb"
    # the operator changes a role; the instance then registers with it
    controller.admin.patch("/v1/hosts/gw1", {"role": "lb"})
    assert nat.post("/v1/hosts", json={"name": "gw1", "vtep_ip": "192.0.2.21", "kind": "gateway",
                                       "role": "lb"}).status_code == 200
    r = controller.raw(controller.admin_token).post("/v1/host-tokens", json={"host": "hv1", "role": "nat"})
    assert r.status_code == 422 and r.json()["field"] == "role"


def test_the_admin_cannot_put_one_tenants_eip_on_anothers_resources(controller: Controller) -> None:
    a, vpc, sn = network(controller)
    b = controller.tenant()
    admin = controller.raw(controller.admin_token)
    b_eip = controller.admin.post("/v1/eips", {"tenant_id": b.tenant_id})
    before = controller.snapshot()
    r = admin.post("/v1/load-balancers", json={"name": "lb", "vpc_id": vpc["id"], "subnet_id": sn["id"],
                                               "eip_id": b_eip["id"]})
    assert r.status_code == 404 and r.json()["field"] == "eip_id", r.text
    assert controller.snapshot() == before
    a_eip = a.post("/v1/eips", {})
    gw = a.post("/v1/nat-gateways", {"vpc_id": vpc["id"], "eip_ids": [a_eip["id"]]})
    port = a.post("/v1/ports", {"subnet_id": sn["id"], "name": "p"})
    before = controller.snapshot()
    r = admin.post(f"/v1/nat-gateways/{gw['id']}/dnat-rules", json={
        "eip_id": b_eip["id"], "protocol": "tcp", "external_port": 80, "port_id": port["id"], "internal_port": 80})
    assert r.status_code == 404 and r.json()["field"] == "eip_id", r.text
    r = admin.post(f"/v1/eips/{b_eip['id']}/associate", json={"port_id": port["id"]})
    assert r.status_code == 404 and r.json()["field"] == "port_id", r.text
    assert controller.snapshot() == before


@pytest.fixture(params=backends())
def behind_proxy(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Controller]:
    with served(request.param, tmp_path, auth_fail_limit=0.1, auth_fail_burst=5,
                trusted_proxies=["127.0.0.1"]) as c:
        yield c


def test_failed_logins_count_per_client_behind_a_trusted_proxy_and_per_credential(behind_proxy: Controller) -> None:
    c = behind_proxy
    good = c.tenant()

    def call(token: str, client: str) -> int:
        return httpx.get(f"{c.url}/v1/vpcs", headers={"Authorization": f"Bearer {token}",
                                                       "X-Forwarded-For": client}).status_code

    bad = [call(f"tjt_wrong{i}", "10.9.9.9") for i in range(10)]
    assert bad[:5] == [401] * 5 and bad[-3:] == [429] * 3, bad
    # another client behind the same proxy is not locked out by the bad one (its token is not cached yet)
    c.app.state.__dict__.get("_principals", {}).clear()
    assert call(token_of(good), "10.9.9.10") == 200
    # one wrong token tried from many addresses: limited as a credential
    spread = [call("tjt_same_wrong", f"10.8.0.{i}") for i in range(10)]
    assert spread[:5] == [401] * 5 and 429 in spread[5:], spread


def test_forwarded_addresses_are_believed_only_from_trusted_proxies(tmp_path: Path) -> None:
    with served("sqlite", tmp_path, auth_fail_limit=0.1, auth_fail_burst=5) as c:  # no proxy declared
        codes = [httpx.get(f"{c.url}/v1/vpcs", headers={"Authorization": f"Bearer tjt_wrong{i}",
                                                         "X-Forwarded-For": f"10.7.0.{i}"}).status_code
                 for i in range(10)]
        assert codes[-3:] == [429] * 3, codes  # the client cannot pick a fresh address per guess


def test_the_unauthenticated_health_check_says_nothing_and_no_server_header(controller: Controller) -> None:
    r = httpx.get(f"{controller.url}/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    assert "server" not in r.headers
    got = controller.admin.get("/healthz")
    assert got["revision"] >= 0 and got["database"] in ("sqlite", "postgresql")
    for r in (httpx.get(f"{controller.url}/v1/vpcs"), controller.raw(controller.admin_token).get("/v1/tenants")):
        assert "server" not in r.headers, r.headers
