"""Services and their endpoints through the API: the operator's shared services (addresses on the service network,
apart from the underlay, the EIP pools and the tenants' public ranges), a tenant's load balancer published to named
tenants, endpoints in consumers' subnets (an address of the subnet, a DNS name, security groups as a port's), and
every refusal a clear 4xx that changes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.test_resources import expect, make_vpc
from tests.conftest import Controller, backends, served

STORE = {"name": "store", "addresses": ["100.100.0.10"], "ports": [{"protocol": "tcp", "port": 80}]}


@pytest.fixture(params=backends())
def ctl(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Controller]:
    with served(request.param, tmp_path, service_network="100.100.0.0/16", underlay_cidrs=["172.31.0.0/16"],
                vpc_public_cidrs=["100.101.0.0/16"]) as c:
        yield c


def consumer(ctl: Controller, cidr: str = "10.0.0.0/16"):
    t = ctl.tenant()
    vpc = make_vpc(t, cidr=cidr)
    sn = t.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": cidr.replace("0.0/16", "1.0/24")})
    return t, vpc, sn


@pytest.mark.parametrize("bad,status,field", [
    ({"addresses": ["100.99.0.1"]}, 422, "addresses.0"),  # off the service network
    ({"addresses": ["127.0.0.1"]}, 422, "addresses.0"),
    ({"addresses": ["100.100.0.10", "100.100.0.10"]}, 422, "addresses"),
    ({"addresses": []}, 422, "addresses"),
    ({"ports": [{"protocol": "sctp", "port": 80}]}, 422, "ports.0.protocol"),
    ({"ports": [{"protocol": "tcp", "port": 0}]}, 422, "ports.0.port"),
    ({"ports": [{"protocol": "tcp", "port": 80}, {"protocol": "tcp", "port": 80}]}, 422, "ports"),
    ({"name": "Store_1"}, 422, "name"),
    ({"allowed_tenants": ["no-such-tenant"]}, 422, "allowed_tenants.0"),
])
def test_bad_services_are_refused_and_change_nothing(ctl: Controller, bad: dict, status: int, field: str) -> None:
    before = ctl.snapshot()
    expect(status, ctl.admin.post, "/v1/services", STORE | bad, field=field)
    assert ctl.snapshot() == before


def test_service_addresses_stay_off_the_underlay_eip_pools_and_public_ranges(tmp_path: Path) -> None:
    with served(backends()[0], tmp_path, underlay_cidrs=["172.31.0.0/16"], vpc_public_cidrs=["100.101.0.0/16"]) \
            as ctl:
        ctl.admin.post("/v1/eip-pools", {"cidr": "203.0.113.0/24"})
        ctl.admin.post("/v1/hosts", {"name": "hv1", "vtep_ip": "192.168.99.1"})
        before = ctl.snapshot()
        for address, why in (("172.31.0.9", "underlay"), ("192.168.99.1", "underlay"), ("203.0.113.5", "EIP pool"),
                             ("100.101.0.1", "VPC")):
            e = expect(409, ctl.admin.post, "/v1/services", STORE | {"addresses": [address]}, field="addresses.0")
            assert why in e.detail, e.detail
        assert ctl.snapshot() == before
        ctl.admin.post("/v1/services", STORE)
        expect(409, ctl.admin.post, "/v1/services", STORE | {"name": "other"}, field="addresses.0")  # taken
        expect(409, ctl.admin.post, "/v1/services", STORE | {"addresses": ["100.100.0.11"]}, field="name")


def test_only_the_operator_registers_shared_services_and_tenants_see_name_and_ports(ctl: Controller) -> None:
    a, vpc, sn = consumer(ctl)
    before = ctl.snapshot()
    expect(403, a.post, "/v1/services", STORE)
    assert ctl.snapshot() == before
    svc = ctl.admin.post("/v1/services", STORE | {"proxy_protocol": True})
    assert svc["kind"] == "shared" and svc["addresses"] == ["100.100.0.10"] and svc["endpoints"] == 0
    (seen,) = a.get("/v1/services")
    assert seen["name"] == "store" and seen["ports"] == [{"protocol": "tcp", "port": 80}]
    assert seen["addresses"] is None and seen["allowed_tenants"] is None  # the service network stays the operator's
    expect(403, a.delete, f"/v1/services/{svc['id']}")
    expect(403, a.patch, f"/v1/services/{svc['id']}", {"allowed_tenants": []})
    # shared with a list: a tenant off it sees nothing and cannot make an endpoint
    db = ctl.admin.post("/v1/services", {"name": "db", "addresses": ["100.100.0.20"],
                                         "ports": [{"protocol": "tcp", "port": 5432}], "allowed_tenants": []})
    assert [x["name"] for x in a.get("/v1/services")] == ["store"]
    expect(404, a.get, f"/v1/services/{db['id']}")
    expect(404, a.post, "/v1/service-endpoints", {"vpc_id": vpc["id"], "subnet_id": sn["id"],
                                                 "service_id": db["id"]}, field="service_id")
    ctl.admin.patch(f"/v1/services/{db['id']}", {"allowed_tenants": [a.tenant_id]})
    assert [x["name"] for x in a.get("/v1/services")] == ["db", "store"]


def test_endpoint_lifecycle_address_name_groups_and_uniqueness(ctl: Controller) -> None:
    svc = ctl.admin.post("/v1/services", STORE)
    a, vpc, sn = consumer(ctl)
    sg = a.post("/v1/security-groups", {"vpc_id": vpc["id"], "name": "clients"})
    ep = a.post("/v1/service-endpoints", {"vpc_id": vpc["id"], "subnet_id": sn["id"], "service_id": svc["id"],
                                          "security_group_ids": [sg["id"]]})
    assert ep["address"].startswith("10.0.1.") and ep["dns_name"] == "store.v1.internal"
    assert ep["security_group_ids"] == [sg["id"]] and ep["service_name"] == "store"
    port = a.get(f"/v1/ports/{ep['port_id']}")
    assert port["ip"] == ep["address"] and port["security_group_ids"] == [sg["id"]]
    assert ctl.admin.get(f"/v1/services/{svc['id']}")["endpoints"] == 1
    before = ctl.snapshot()
    expect(409, a.post, "/v1/service-endpoints", {"vpc_id": vpc["id"], "subnet_id": sn["id"],
                                                 "service_id": svc["id"]}, field="service_id")
    expect(409, a.delete, f"/v1/ports/{ep['port_id']}")  # the endpoint's own: delete the endpoint
    expect(409, ctl.admin.delete, f"/v1/services/{svc['id']}")  # endpoints still use it
    assert ctl.snapshot() == before
    assert [x["id"] for x in a.get("/v1/service-endpoints")] == [ep["id"]]
    a.delete(f"/v1/service-endpoints/{ep['id']}")
    expect(404, a.get, f"/v1/ports/{ep['port_id']}")  # its address is the subnet's again
    again = a.post("/v1/service-endpoints", {"vpc_id": vpc["id"], "subnet_id": sn["id"], "service_id": svc["id"],
                                             "ip": ep["address"]})
    assert again["address"] == ep["address"]


def test_endpoints_never_cross_tenants(ctl: Controller) -> None:
    svc = ctl.admin.post("/v1/services", STORE)
    a, vpc_a, sn_a = consumer(ctl)
    b, vpc_b, sn_b = consumer(ctl)  # the same CIDR: tenants with identical addresses both get endpoints
    ep_a = a.post("/v1/service-endpoints", {"vpc_id": vpc_a["id"], "subnet_id": sn_a["id"], "service_id": svc["id"]})
    ep_b = b.post("/v1/service-endpoints", {"vpc_id": vpc_b["id"], "subnet_id": sn_b["id"], "service_id": svc["id"]})
    assert ep_a["address"] == ep_b["address"]  # each in its own VPC
    before = ctl.snapshot()
    expect(404, b.post, "/v1/service-endpoints", {"vpc_id": vpc_b["id"], "subnet_id": sn_a["id"],
                                                 "service_id": svc["id"]}, field="subnet_id")
    expect(404, b.post, "/v1/service-endpoints", {"vpc_id": vpc_a["id"], "subnet_id": sn_a["id"],
                                                 "service_id": svc["id"]}, field="vpc_id")
    expect(404, b.get, f"/v1/service-endpoints/{ep_a['id']}")
    expect(404, b.delete, f"/v1/service-endpoints/{ep_a['id']}")
    assert ctl.snapshot() == before
    assert [x["id"] for x in b.get("/v1/service-endpoints")] == [ep_b["id"]]
    assert ctl.admin.get(f"/v1/services/{svc['id']}")["endpoints"] == 2


def test_a_tenant_publishes_its_load_balancer_to_the_tenants_it_names(ctl: Controller) -> None:
    prov = ctl.tenant()
    pvpc = make_vpc(prov, cidr="10.9.0.0/16")
    psn = prov.post("/v1/subnets", {"vpc_id": pvpc["id"], "name": "s", "cidr": "10.9.1.0/24"})
    lb = prov.post("/v1/load-balancers", {"name": "api", "vpc_id": pvpc["id"], "subnet_id": psn["id"]})
    prov.post(f"/v1/load-balancers/{lb['id']}/listeners", {"protocol": "tcp", "port": 443})
    a, vpc_a, sn_a = consumer(ctl)
    b, vpc_b, sn_b = consumer(ctl)
    before = ctl.snapshot()
    expect(404, a.post, "/v1/services", {"load_balancer_id": lb["id"], "allowed_tenants": []},
           field="load_balancer_id")  # not a's to publish
    expect(422, prov.post, "/v1/services", {"load_balancer_id": lb["id"], "addresses": ["100.100.0.9"]})
    assert ctl.snapshot() == before
    svc = prov.post("/v1/services", {"name": "partner-api", "load_balancer_id": lb["id"],
                                     "allowed_tenants": [a.tenant_id]})
    assert svc["kind"] == "load-balancer" and svc["ports"] == [{"protocol": "tcp", "port": 443}]
    assert svc["addresses"] == [lb["vip_address"]] and svc["allowed_tenants"] == [a.tenant_id]
    assert [x["name"] for x in a.get("/v1/services")] == ["partner-api"]
    assert b.get("/v1/services") == []
    a.post("/v1/service-endpoints", {"vpc_id": vpc_a["id"], "subnet_id": sn_a["id"], "service_id": svc["id"]})
    expect(404, b.post, "/v1/service-endpoints", {"vpc_id": vpc_b["id"], "subnet_id": sn_b["id"],
                                                 "service_id": svc["id"]}, field="service_id")
    expect(409, prov.post, "/v1/service-endpoints", {"vpc_id": pvpc["id"], "subnet_id": psn["id"],
                                                    "service_id": svc["id"]}, field="service_id")  # its own VPC
    expect(409, prov.delete, f"/v1/load-balancers/{lb['id']}")  # published: the service goes first
    expect(409, prov.post, "/v1/services", {"load_balancer_id": lb["id"], "allowed_tenants": []},
           field="load_balancer_id")


def test_an_endpoint_name_is_in_its_vpcs_host_configs_and_leaves_with_it(ctl: Controller) -> None:
    svc = ctl.admin.post("/v1/services", STORE)
    a, vpc, sn = consumer(ctl)
    b, vpc_b, sn_b = consumer(ctl)
    ctl.admin.post("/v1/hosts", {"name": "hv1", "vtep_ip": "172.31.0.1"})
    for t, s in ((a, sn), (b, sn_b)):
        port = t.post("/v1/ports", {"subnet_id": s["id"], "name": "vm"})
        ctl.orchestrator().patch(f"/v1/ports/{port['id']}", {"host": "hv1"})
    ep = a.post("/v1/service-endpoints", {"vpc_id": vpc["id"], "subnet_id": sn["id"], "service_id": svc["id"]})

    def dns_of(vpc_id: str) -> list[dict]:
        cfg = ctl.admin.get("/v1/hosts/hv1/config")
        return next(v for v in cfg["vpcs"] if v["id"] == vpc_id)["dns"]

    assert dns_of(vpc["id"]) == [{"name": "store.v1.internal", "address": ep["address"]}]
    assert dns_of(vpc_b["id"]) == []  # another tenant's VPC on the same host resolves nothing of it
    a.delete(f"/v1/service-endpoints/{ep['id']}")
    assert dns_of(vpc["id"]) == []
