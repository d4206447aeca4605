"""The OpenAPI document follows what clients and Swagger UI need: a bearer scheme, each operation's real error
codes (problem+json), a typed answer for every operation, an example on every schema; and the docs pages load
their files from this controller only."""

from __future__ import annotations

import re

import pytest

from tests.support.controller import Controller


@pytest.fixture
def doc(controller: Controller) -> dict:
    return controller.raw().get("/openapi.json").json()


def operations(doc: dict):
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            yield path, method, op


def test_bearer_scheme_on_every_operation(doc: dict) -> None:
    scheme = doc["components"]["securitySchemes"]["HTTPBearer"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    for path, method, op in operations(doc):
        if path.startswith("/v1/"):
            assert op["security"] == [{"HTTPBearer": []}], (method, path)
        else:
            assert {"HTTPBearer": []} in op["security"], (method, path)


def test_every_operation_has_a_typed_answer(doc: dict) -> None:
    untyped = []
    for path, method, op in operations(doc):
        for code, r in op["responses"].items():
            if code.startswith("2") and code != "204":
                schema = next(iter(r.get("content", {}).values()), {}).get("schema")
                if not schema or schema == {} or schema.get("type") == "object" and not (
                        schema.get("properties") or schema.get("additionalProperties")):
                    untyped.append(f"{method.upper()} {path} {code}")
    assert untyped == []


def test_errors_are_declared_per_operation_as_problems(doc: dict) -> None:
    ops = {(m, p): op for p, m, op in operations(doc)}

    def codes(method: str, path: str) -> set[str]:
        return {c for c in ops[(method, path)]["responses"] if c[0] in "45"}

    assert codes("get", "/v1/vpcs/{vpc_id}") == {"401", "403", "404", "422", "429"}
    assert codes("post", "/v1/vpcs") == {"401", "403", "404", "409", "413", "422", "429"}  # 404: tenant_id
    assert codes("get", "/v1/whoami") == {"401", "422", "429"}
    assert "503" in codes("get", "/readyz")
    assert any(x["name"] == "Idempotency-Key" for x in ops[("post", "/v1/vpcs")]["parameters"])
    for path, _method, op in operations(doc):
        for code, r in op["responses"].items():
            if code[0] in "4" and path.startswith("/v1/"):
                assert r["content"]["application/problem+json"]["schema"] == {"$ref": "#/components/schemas/Problem"}


def test_the_codes_the_api_answers_are_the_ones_it_declares(controller: Controller, doc: dict) -> None:
    t = controller.tenant()
    vpc = t.post("/v1/vpcs", {"name": "prod", "cidr": "10.0.0.0/16"})
    raw_t, raw = controller.raw(t.token), controller.raw()
    seen = [
        ("post", "/v1/vpcs", raw_t.post("/v1/vpcs", json={"name": "prod", "cidr": "10.1.0.0/16"})),  # 409
        ("post", "/v1/vpcs", raw_t.post("/v1/vpcs", json={"name": "x", "cidr": "nope"})),  # 422
        ("post", "/v1/vpcs", raw_t.post("/v1/vpcs", content=b"{" + b" " * (2 << 20) + b"}",
                                        headers={"content-type": "application/json"})),  # 413
        ("get", "/v1/vpcs/{vpc_id}", raw_t.get("/v1/vpcs/nosuch")),  # 404
        ("get", "/v1/vpcs/{vpc_id}", raw.get(f"/v1/vpcs/{vpc['id']}")),  # 401
        ("post", "/v1/eip-pools", raw_t.post("/v1/eip-pools", json={"cidr": "203.0.113.0/28"})),  # 403
    ]
    ops = {(m, p): op for p, m, op in operations(doc)}
    for method, path, r in seen:
        assert str(r.status_code) in ops[(method, path)]["responses"], (method, path, r.status_code)
        assert r.headers["content-type"].startswith("application/problem+json")
    assert {r.status_code for *_, r in seen} == {409, 422, 413, 404, 401, 403}


def test_every_schema_has_an_example(doc: dict) -> None:
    bare = [n for n, s in doc["components"]["schemas"].items() if not (s.get("examples") or "example" in s)]
    assert bare == []
    port = doc["components"]["schemas"]["PortOut"]["examples"][0]
    assert port["ip"] == "10.0.1.5" and port["name"] == "web"


@pytest.mark.parametrize("page,assets", [
    ("/docs", ("/static/docs/swagger-ui-bundle.js", "/static/docs/swagger-ui.css")), ("/redoc", ("/static/redoc.js",))])
def test_docs_pages_use_local_files_only(controller: Controller, page: str, assets: tuple[str, ...]) -> None:
    html = controller.raw().get(page).text
    outside = re.findall(r"""(?:src|href)=["'](https?:)?//""", html) + re.findall(r"https?://(?!127\.)", html)
    assert outside == [], outside
    for a in assets:
        assert a in html
        r = controller.raw().get(a)
        assert r.status_code == 200 and len(r.content) > 50_000
        assert b"cdn.redoc.ly" not in r.content  # ReDoc's footer logo: this controller's, not its CDN's
