"""Every operation of the API driven with hostile values, as schemathesis does: each path parameter, query parameter
and body field (one level into lists of objects too) in turn replaced by a hostile string, integer, list, object or
null while the rest of the request stays valid, and every body replaced by malformed JSON. Nothing may answer 5xx,
on either backend, and a request refused changes nothing it names.

The operations are read from the app's own OpenAPI document, so a new route is fuzzed without anyone adding it here;
`BASELINES` holds a valid request per operation (a new write route without one fails the test)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.conftest import Controller, backends, served

STRINGS = ["", " ", "\x00", "a\x00b", "²", "٣", "not-an-ip", "fd00::1", "10.70.1.300", "256.1.1.1/24", "10.0.0.0/33",
           "0.0.0.0/0", "-1", "1e999", "x" * 5000, "'; DROP TABLE tenants; --", "%00", "../../etc/passwd",
           "\ud800", "🙂", "\u202e", "null", "[]", "{}"]
INTS = [-1, 0, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**40]
OTHERS: list[Any] = [None, True, 1.5, -0.0, [], {}, ["x"] * 300, [None], [{"a": 1}], {"\x00": 1}, {"k": "\x00"},
                     [2**63], ["a", "a"]]
HOSTILE = STRINGS + INTS + OTHERS
PATH_HOSTILE = ["%00", "²", "-1", "0", str(2**31), str(2**63), str(2**64), "x" * 300, "%F0%9F%99%82", "%ED%A0%80",
                "%2E%2E", "a%2Fb", "'", "null"]
RAW_BODIES = ["", "{", "null", "[]", '"x"', "1", "{\"a\": 1e999}", "[" * 50_000 + "]" * 50_000,
              '{"a":' * 20_000 + "1" + "}" * 20_000, '{"name": "\\ud800"}', "\xff\xfe"]


class World:
    """A tenant's network with one of everything, made through the API: the ids the baselines refer to."""

    def __init__(self, c: Controller) -> None:
        a = c.admin
        self.ctl = c
        t = a.post("/v1/tenants", {"name": "fuzz-a"})
        self.tenant_id = t["id"]
        self.spare_tenant = a.post("/v1/tenants", {"name": "fuzz-b"})["id"]  # quotas and tokens are fuzzed here
        tid = self.tenant_id
        a.put(f"/v1/tenants/{tid}/quotas", {r: -1 for r in a.get(f"/v1/tenants/{tid}/quotas")})
        a.post("/v1/hosts", {"name": "hv1", "vtep_ip": "192.0.2.11"})
        a.post("/v1/hosts", {"name": "gw1", "vtep_ip": "192.0.2.21", "kind": "gateway"})
        self.vpc = a.post("/v1/vpcs", {"name": "v", "cidr": "10.0.0.0/16", "tenant_id": tid})
        self.vpc2 = a.post("/v1/vpcs", {"name": "w", "cidr": "10.1.0.0/16", "tenant_id": tid})
        self.subnet = a.post("/v1/subnets", {"vpc_id": self.vpc["id"], "name": "s", "cidr": "10.0.1.0/24"})
        self.port = a.post("/v1/ports", {"subnet_id": self.subnet["id"], "name": "p", "host": "hv1"})
        self.port2 = a.post("/v1/ports", {"subnet_id": self.subnet["id"], "name": "q"})
        self.sg = a.post("/v1/security-groups", {"vpc_id": self.vpc["id"], "name": "g", "rules": [
            {"direction": "ingress", "protocol": "tcp", "port_range_min": 22, "port_range_max": 22}]})
        self.peering = a.post("/v1/peerings", {"requester_vpc_id": self.vpc["id"], "accepter_vpc_id": self.vpc2["id"]})
        self.route = a.post(f"/v1/vpcs/{self.vpc['id']}/routes", {"destination": "10.1.5.0/24",
                                                                   "target": f"peering:{self.peering['id']}"})
        self.eip_pool = a.post("/v1/eip-pools", {"cidr": "198.51.100.0/24"})
        self.eips = [a.post("/v1/eips", {"tenant_id": tid}) for _ in range(4)]
        self.natgw = a.post("/v1/nat-gateways", {"vpc_id": self.vpc["id"], "eip_ids": [self.eips[0]["id"]]})
        self.snat = a.post(f"/v1/nat-gateways/{self.natgw['id']}/snat-rules",
                           {"cidr": "10.0.1.0/24", "eip_ids": [self.eips[0]["id"]]})
        self.dnat = a.post(f"/v1/nat-gateways/{self.natgw['id']}/dnat-rules", {
            "eip_id": self.eips[1]["id"], "protocol": "tcp", "external_port": 80, "port_id": self.port["id"],
            "internal_port": 8080})
        self.lb = a.post("/v1/load-balancers", {"name": "lb", "vpc_id": self.vpc["id"],
                                                "subnet_id": self.subnet["id"]})
        self.pool = a.post("/v1/pools", {"load_balancer_id": self.lb["id"], "name": "pl", "protocol": "tcp"})
        self.listener = a.post(f"/v1/load-balancers/{self.lb['id']}/listeners",
                               {"protocol": "tcp", "port": 80, "default_pool_id": self.pool["id"]})
        self.member = a.post(f"/v1/pools/{self.pool['id']}/members",
                             {"port_id": self.port["id"], "protocol_port": 8080})
        self.line = a.post("/v1/private-lines", {"name": "dc", "vpc_id": self.vpc["id"], "vlan_id": 4000,
                                                 "customer_asn": 65001, "customer_ip": "169.254.0.2/30",
                                                 "local_ip": "169.254.0.1/30"})
        self.service = a.post("/v1/services", {"name": "store", "addresses": ["100.100.0.1"],
                                               "ports": [{"protocol": "tcp", "port": 80}]})
        self.endpoint = a.post("/v1/service-endpoints", {"vpc_id": self.vpc["id"], "subnet_id": self.subnet["id"],
                                                         "service_id": self.service["id"]})
        self.token = a.post(f"/v1/tenants/{self.spare_tenant}/tokens", {"name": "extra"})
        self.host_token = a.post("/v1/host-tokens", {"host": "hv1", "name": "hv1-fuzz"})
        self.path_values = {
            "tenant_id": self.spare_tenant, "vpc_id": self.vpc["id"], "subnet_id": self.subnet["id"],
            "port_id": self.port2["id"], "peering_id": self.peering["id"], "sg_id": self.sg["id"],
            "rule_id": None, "route_id": self.route["id"], "name": "hv1", "eip_id": self.eips[2]["id"],
            "gw_id": self.natgw["id"], "lb_id": self.lb["id"], "listener_id": self.listener["id"],
            "pool_id": self.pool["id"], "member_id": self.member["id"], "token_id": self.token["id"],
            "line_id": self.line["id"], "service_id": self.service["id"], "endpoint_id": self.endpoint["id"],
            # answering a trace nobody asked is a 404; its input is still fuzzed
            "trace_id": "no-such-trace", "eip_pool_id": self.eip_pool["id"]}

    def baseline(self, method: str, path: str, seq: int) -> dict[str, Any] | None:
        """A valid body for the operation (None: it takes none). Names are fresh each time, so a request that is
        accepted does not make the next one a conflict."""
        v, s, n = self.vpc["id"], self.subnet["id"], f"fz{seq}"
        bodies: dict[tuple[str, str], Any] = {
            ("POST", "/v1/tenants"): {"name": n},
            ("PUT", "/v1/tenants/{tenant_id}/quotas"): {"ports": 100, "load_balancers": 5},
            ("POST", "/v1/tenants/{tenant_id}/tokens"): {"name": n},
            ("POST", "/v1/host-tokens"): {"host": "hv1", "kind": "hypervisor", "name": n},
            ("POST", "/v1/orchestrator-tokens"): {"name": n},
            ("POST", "/v1/vpcs"): {"name": n, "cidr": "10.9.0.0/16", "mtu": 1400, "tenant_id": self.tenant_id},
            ("POST", "/v1/vpcs/{vpc_id}/routes"): {"destination": "10.1.9.0/24",
                                                   "target": f"peering:{self.peering['id']}"},
            ("POST", "/v1/subnets"): {"vpc_id": v, "name": n, "cidr": f"10.0.{100 + seq % 100}.0/24"},
            ("POST", "/v1/ports"): {"subnet_id": s, "name": n, "ip": None, "mac": None, "host": "hv1",
                                    "security_group_ids": [self.sg["id"]]},
            ("POST", "/v1/ports/bulk"): {"ports": [{"subnet_id": s, "name": n, "host": "hv1",
                                                    "security_group_ids": [self.sg["id"]]}]},
            ("PATCH", "/v1/ports/{port_id}"): {"name": n, "host": "hv1", "security_group_ids": [self.sg["id"]],
                                               "description": "d", "tags": ["a", "b"]},
            ("PATCH", "/v1/vpcs/{vpc_id}"): {"name": n, "description": "d", "tags": ["x"]},
            ("PATCH", "/v1/subnets/{subnet_id}"): {"name": n, "description": "d", "tags": ["x"]},
            ("PATCH", "/v1/security-groups/{sg_id}"): {"name": n, "description": "d", "tags": ["x"]},
            ("POST", "/v1/peerings"): {"requester_vpc_id": v, "accepter_vpc_id": self.vpc2["id"]},
            ("POST", "/v1/security-groups"): {"vpc_id": v, "name": n, "description": "d", "rules": [
                {"direction": "ingress", "protocol": "udp", "port_range_min": 53, "port_range_max": 53,
                 "remote_cidr": "10.0.0.0/8", "remote_group_id": None, "description": "x"}]},
            ("POST", "/v1/security-groups/{sg_id}/rules"): {
                "direction": "egress", "protocol": "tcp", "port_range_min": 1 + seq % 60000,
                "port_range_max": 1 + seq % 60000, "remote_cidr": None, "remote_group_id": self.sg["id"],
                "description": "x"},
            ("POST", "/v1/hosts"): {"name": "hv1", "vtep_ip": "192.0.2.11", "kind": "hypervisor", "role": None},
            ("PATCH", "/v1/hosts/{name}"): {"vtep_ip": "192.0.2.11", "role": None},
            ("POST", "/v1/hosts/{name}/status"): {"ports": {self.port["id"]: "UP"}},
            ("POST", "/v1/eip-pools"): {"cidr": "203.0.113.0/28"},
            ("PUT", "/v1/hosts/{name}/traces/{trace_id}"): {"output": "Datapath actions: drop", "ofports": {"p": 1},
                                                            "error": None},
            ("POST", "/v1/reachability"): {"source_port_id": self.port["id"], "destination": {"ip": "10.0.1.9"},
                                           "protocol": "tcp", "port": 443},
            ("POST", "/v1/eips"): {"tenant_id": self.tenant_id},
            ("POST", "/v1/eips/{eip_id}/associate"): {"port_id": self.port2["id"]},
            ("POST", "/v1/nat-gateways"): {"vpc_id": v, "name": n, "eip_ids": [self.eips[3]["id"]]},
            ("POST", "/v1/nat-gateways/{gw_id}/snat-rules"): {"subnet_id": None, "cidr": f"10.0.{seq % 250}.0/28",
                                                              "eip_ids": [self.eips[0]["id"]]},
            ("POST", "/v1/nat-gateways/{gw_id}/dnat-rules"): {
                "eip_id": self.eips[1]["id"], "protocol": "udp", "external_port": 1 + seq % 60000,
                "port_id": self.port["id"], "internal_port": 53},
            ("POST", "/v1/load-balancers"): {"name": n, "vpc_id": v, "subnet_id": s, "vip_address": None,
                                             "eip_id": None},
            ("POST", "/v1/load-balancers/{lb_id}/listeners"): {"protocol": "tcp", "port": 1 + seq % 60000,
                                                               "default_pool_id": self.pool["id"],
                                                               "idle_timeout_s": 60},
            ("POST", "/v1/pools"): {"load_balancer_id": self.lb["id"], "name": n, "protocol": "tcp",
                                    "table_size": 251, "deregistration_delay_s": 0},
            ("POST", "/v1/pools/{pool_id}/members"): {"port_id": self.port2["id"], "protocol_port": 80,
                                                      "weight": 1},
            ("PATCH", "/v1/pools/{pool_id}/members/{member_id}"): {"weight": 2},
            ("PUT", "/v1/pools/{pool_id}/health-monitor"): {"type": "tcp", "interval_s": 5, "timeout_s": 2,
                                                            "rise": 2, "fall": 2},
            ("POST", "/v1/hosts/{name}/lb-health"): {"members": {self.member["id"]: "ONLINE"}},
            ("POST", "/v1/private-lines"): {"name": n, "vpc_id": v, "vlan_id": 100 + seq % 3800, "customer_asn": 65001,
                                            "customer_ip": "169.254.1.2/30", "local_ip": "169.254.1.1/30",
                                            "secondary": None, "md5_password": "pw", "max_prefixes": 100,
                                            "static_routes": ["192.168.0.0/24"]},
            ("PATCH", "/v1/private-lines/{line_id}"): {"md5_password": "x", "max_prefixes": 10,
                                                      "static_routes": ["192.168.1.0/24"]},
            ("POST", "/v1/services"): {"name": n, "addresses": [f"100.100.{1 + seq // 250}.{1 + seq % 250}"],
                                       "ports": [{"protocol": "tcp", "port": 80}], "proxy_protocol": True,
                                       "load_balancer_id": None, "allowed_tenants": [self.tenant_id]},
            ("PATCH", "/v1/services/{service_id}"): {"allowed_tenants": [self.tenant_id]},
            ("POST", "/v1/service-endpoints"): {"vpc_id": self.vpc2["id"], "subnet_id": s,
                                                "service_id": self.service["id"], "ip": None,
                                                "security_group_ids": [self.sg["id"]]},
            ("PUT", "/v1/gateways/{name}/private-lines/{line_id}"): {"sessions": [{
                "local_ip": "169.254.0.1", "bgp_state": "Established", "bfd_state": "up", "received": 1,
                "accepted": 1, "advertised": 1, "last_error": None, "prefixes": ["192.168.5.0/24"]}]},
        }
        return bodies.get((method, path))


def fields(body: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every place in a body a value can be replaced: its fields, and those of a list's first object."""
    if isinstance(body, dict):
        for k, v in body.items():
            yield (*prefix, k)
            if isinstance(v, list) and v and isinstance(v[0], dict):
                yield from fields(v[0], (*prefix, k, 0))
            elif isinstance(v, dict):
                yield from fields(v, (*prefix, k))


def replaced(body: Any, where: tuple, value: Any) -> Any:
    body = json.loads(json.dumps(body))
    node = body
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    return body


def requests(world: World, spec: dict) -> Iterator[tuple[str, str, dict, Any]]:
    """(method, url, query, body or raw text) for every hostile variation of every operation."""
    seq = itertools.count()
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            method = method.upper()
            params = op.get("parameters", [])
            path_params = [p["name"] for p in params if p["in"] == "path"]
            takes_body = "requestBody" in op
            base = world.baseline(method, path, next(seq)) if takes_body else None
            if takes_body and base is None and method != "DELETE":
                raise AssertionError(f"{method} {path}: no baseline body in test_fuzz.World.baseline; add one")
            values = dict(world.path_values)
            values["rule_id"] = {"/v1/nat-gateways/{gw_id}/snat-rules/{rule_id}": world.snat["id"],
                                 "/v1/nat-gateways/{gw_id}/dnat-rules/{rule_id}": world.dnat["id"]}.get(
                path, world.sg["rules"][0]["id"])
            if path.startswith("/v1/gateways/"):
                values["name"] = "gw1"

            def url(override: dict[str, str] | None = None, _path: str = path, _values: dict = values,
                    _names: list = path_params) -> str:
                out = _path
                for name in _names:
                    raw = (override or {}).get(name)
                    out = out.replace("{" + name + "}", raw if raw is not None else quote(str(_values[name]), safe=""))
                return out

            query_base = {p["name"]: (0 if p["name"] == "timeout" else None) for p in params if p["in"] == "query"}
            query_base = {k: v for k, v in query_base.items() if v is not None}
            if method == "DELETE":  # real ids would delete the world: only hostile ones
                for name in path_params:
                    for h in PATH_HOSTILE:
                        yield method, url({name: h}), {}, None
                continue
            for name in path_params:
                for h in PATH_HOSTILE:
                    yield method, url({name: h}), query_base, base
            for p in params:
                if p["in"] == "query":
                    for h in [x for x in STRINGS if x != "\ud800"] + [str(i) for i in INTS]:
                        yield method, url(), {**query_base, p["name"]: h}, base
                    for raw in ("%ED%A0%80", "%FF", "%00", "%C0%80"):  # not UTF-8, or NUL: as sent on the wire
                        yield method, f"{url()}?{p['name']}={raw}", query_base, base
            if takes_body:
                for where in fields(base):
                    for h in HOSTILE:
                        yield method, url(), query_base, replaced(base, where, h)
                for raw in RAW_BODIES:
                    yield method, url(), query_base, ("raw", raw)


def send(http: httpx.Client, method: str, url: str, query: dict, body: Any) -> httpx.Response:
    """The answer; of a stream (the config stream, which lasts as long as its watcher), the status alone."""
    if isinstance(body, tuple):
        content, headers = body[1].encode("utf-8", "surrogatepass"), {"Content-Type": "application/json"}
    else:  # lone surrogates stay escaped, as a client sends
        content = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if content is not None else {}
    with http.stream(method, url, params=query, content=content, headers=headers) as r:
        if not r.headers.get("content-type", "").startswith("text/event-stream"):
            r.read()
        return r


@pytest.fixture(params=backends())
def fuzzed(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Controller]:
    with served(request.param, tmp_path, rate_limit=0, auth_fail_limit=0, max_watch_timeout=0.2) as c:
        yield c


def test_no_operation_answers_5xx_to_hostile_input(fuzzed: Controller) -> None:
    world = World(fuzzed)
    spec = fuzzed.app.openapi()
    cases = list(requests(world, spec))
    assert len(cases) > 5000, len(cases)
    failures: list[str] = []
    statuses: dict[int, int] = {}
    http = fuzzed.raw(fuzzed.admin_token)

    def one(case: tuple) -> None:
        method, url, query, body = case
        try:
            r = send(http, method, url, query, body)
        except httpx.HTTPError as e:  # a dropped connection is a crash the client sees
            failures.append(f"{method} {url} {query} {str(body)[:200]}: {type(e).__name__} {e}")
            return
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        if r.status_code >= 500:
            failures.append(f"{method} {url} {query} {str(body)[:200]}: {r.status_code} {r.text[:300]}")
        elif r.status_code in (400, 409, 413, 422) and r.headers.get("content-type", "").startswith(
                "application/problem+json") and "detail" not in r.json():
            failures.append(f"{method} {url}: {r.status_code} without a detail")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, cases))
    assert not failures, f"{len(failures)} of {len(cases)} failed:\n" + "\n".join(failures[:40])
    assert statuses.get(422, 0) > len(cases) // 3  # most hostile values are refused as invalid, naming the field
    # the world survived: nothing was deleted by a hostile request
    for path in (f"/v1/vpcs/{world.vpc['id']}", f"/v1/ports/{world.port['id']}", f"/v1/load-balancers/{world.lb['id']}",
                 f"/v1/nat-gateways/{world.natgw['id']}"):
        assert http.get(path).status_code == 200
