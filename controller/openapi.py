"""The OpenAPI document and its viewers, as clients and operators need them:

- a bearer security scheme (Swagger UI's Authorize button), required on every /v1 operation;
- each operation's real error codes, from what it is: 401 and 429 for any /v1 call, 403 where a role is required,
  404 where the path names a resource, 409 for writes, 413 with a body, 422 for input; every one answered as
  problem+json (controller/errors.py);
- an example on every schema (one written on the model, else one built from its fields' types and names);
- Swagger UI and ReDoc served from this controller's own files (fastapi-offline's copies): clusters are often
  air-gapped, and a browser must not fetch anything from outside.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, Response
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles

ASSETS = "/static/docs"
SCHEME = "HTTPBearer"  # the bearer scheme's name, as FastAPI gives it (controller/auth.py BEARER)
IDEMPOTENCY_KEY = {"name": "Idempotency-Key", "in": "header", "required": False,
                   "schema": {"type": "string", "minLength": 1, "maxLength": 255},
                   "description": "a retry with the same key (and the same request) gets the first answer, kept a day "
                                  "(controller/idempotency.py)"}
ROLE_CHECKS = ("require_admin", "require_tenant_api", "require_infra", "require_port_api",  # controller/auth.py
               "require_network_read")
WRITES = ("post", "put", "patch", "delete")
# what the docs pages may load: this controller's files (and the blobs and inline scripts the viewers make)
LOCAL_ONLY = ("default-src 'self'; script-src 'self' 'unsafe-inline' blob:; style-src 'self' 'unsafe-inline'; "
              "img-src 'self' data: blob:; worker-src 'self' blob:; connect-src 'self'")
SAMPLES = {"id": "5f0c2a4e-8d1b-4c3e-9a7f-2b6d1e0c9a11", "cidr": "10.0.0.0/16", "ip": "10.0.1.5",
           "address": "10.0.1.5", "mac": "02:00:0a:00:01:05", "name": "web", "host": "hv1", "vtep_ip": "172.31.0.11",
           "destination": "0.0.0.0/0", "protocol": "tcp", "direction": "ingress", "status": "active"}


# the viewers' order of the operations: a tenant's first (what most readers came for), the operator's after
TAGS = [("vpcs", "a tenant's VPCs and their route tables"), ("subnets", "a VPC's subnets"),
        ("ports", "VMs' addresses in a subnet"), ("security-groups", "stateful firewalls on ports"),
        ("peerings", "VPC to VPC, across tenants too"), ("nat", "EIPs and NAT gateways"),
        ("load balancers", "VIPs in front of ports"), ("private lines", "a site's VLAN and BGP into a VPC"),
        ("services", "services outside the VPCs and their endpoints"),
        ("reachability", "the analyzer: what a port reaches, and why"),
        ("tenants", "tenants, their tokens and quotas (the admin's), who am I"),
        ("hosts", "hypervisors and gateway hosts, their credentials and streams (the operator's)"),
        ("gateways", "gateway instances' config watch (the operator's)"), ("ops", "health and metrics")]


def assets_dir() -> Path:
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or spec.origin is None:
        raise RuntimeError("fastapi-offline is not installed: `make setup` installs it (Swagger UI's own files)")
    return Path(spec.origin).parent / "static"


def install(app: FastAPI) -> None:
    """Call after every route is added."""
    app.mount(ASSETS, StaticFiles(directory=assets_dir()), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def swagger() -> HTMLResponse:
        page = get_swagger_ui_html(openapi_url="/openapi.json", title="Tianji API",
                                   swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{ASSETS}/favicon.png",
                                   swagger_ui_parameters={"persistAuthorization": True})
        page.headers["Content-Security-Policy"] = LOCAL_ONLY
        return page

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        page = get_redoc_html(openapi_url="/openapi.json", title="Tianji API", redoc_js_url=REDOC_JS,
                              redoc_favicon_url=f"{ASSETS}/favicon.png", with_google_fonts=False)
        page.headers["Content-Security-Policy"] = LOCAL_ONLY
        return page

    @app.get(REDOC_JS, include_in_schema=False)
    def redoc_js() -> Response:
        return Response(redoc_script(), media_type="application/javascript",
                        headers={"Cache-Control": "public, max-age=86400"})

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes,
                              tags=[{"name": n, "description": d} for n, d in TAGS])
            refine(doc, {r.name: r for r in api_routes(app.routes)})
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


REDOC_JS = "/static/redoc.js"
REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"  # its footer's logo, which its page would fetch from there


@functools.cache
def redoc_script() -> bytes:
    """ReDoc's script with its footer logo taken from this controller (the page's policy would refuse the CDN's,
    and the browser say so in its console)."""
    return (assets_dir() / "redoc.standalone.js").read_bytes().replace(REDOC_LOGO.encode(),
                                                                      f"{ASSETS}/favicon.png".encode())


def api_routes(routes: list[Any]) -> list[APIRoute]:
    """Every APIRoute, those of included routers too (FastAPI keeps those in the router they came from)."""
    out: list[APIRoute] = []
    for r in routes:
        if isinstance(r, APIRoute):
            out.append(r)
        elif (inner := getattr(r, "original_router", None)) is not None:
            out += api_routes(inner.routes)
    return out


def refine(doc: dict[str, Any], routes: dict[str, APIRoute]) -> None:
    """`routes`: by name (the handler's: the operation id begins with it)."""
    comps = doc.setdefault("components", {})
    comps.setdefault("securitySchemes", {}).setdefault(SCHEME, {  # FastAPI declares it from auth.BEARER
        "type": "http", "scheme": "bearer", "description": "a tenant, host, orchestrator or the admin token"})
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            op_id = op.get("operationId", "")
            route = max((r for n, r in routes.items() if op_id.startswith(n + "_")), key=lambda r: len(r.name),
                        default=None)
            if not path.startswith("/v1/"):
                op["security"] = [{}, {SCHEME: []}]  # answers without a token; more with the admin's
                continue
            op["security"] = [{SCHEME: []}]
            if method == "post":
                op.setdefault("parameters", []).append(IDEMPOTENCY_KEY)
            keep = error_codes(path, method, op, route, comps.get("schemas", {}))
            op["responses"] = {c: r for c, r in op["responses"].items() if not c.startswith(("4", "5"))
                               or c in keep}
    for schema in comps.get("schemas", {}).values():
        if "example" not in schema and "examples" not in schema:
            schema["examples"] = [example(schema, comps["schemas"])]


def error_codes(path: str, method: str, op: dict[str, Any], route: APIRoute | None,
                schemas: dict[str, Any]) -> set[str]:
    codes = {"401", "422", "429"}  # 422: the guard refuses a NUL in any path or query
    if route is not None and _checks_role(route):
        codes.add("403")
    # 404: a resource named in the path, referred to in the body (`..._id`), or a list's page marker
    if "{" in path or _refers(op, schemas) or any(p.get("name") == "marker" for p in op.get("parameters", [])):
        codes.add("404")
    if method in WRITES:
        codes.add("409")
    if "requestBody" in op:
        codes.add("413")
    return codes | {c for c in op["responses"] if c in ("304", "503")}


def _refers(op: dict[str, Any], schemas: dict[str, Any]) -> bool:
    body = next(iter(op.get("requestBody", {}).get("content", {}).values()), {}).get("schema", {})
    seen: set[str] = set()

    def walk(s: dict[str, Any]) -> bool:
        if "$ref" in s:
            name = s["$ref"].rsplit("/", 1)[-1]
            if name in seen:
                return False
            seen.add(name)
            return walk(schemas.get(name, {}))
        props = s.get("properties", {})
        inner = [*props.values(), *([s["items"]] if "items" in s else []), *s.get("anyOf", []), *s.get("allOf", [])]
        return any(k.endswith(("_id", "_ids")) for k in props) or any(walk(v) for v in inner if isinstance(v, dict))

    return walk(body)


def _checks_role(route: APIRoute) -> bool:
    def walk(dep: Any) -> bool:
        return getattr(dep.call, "__name__", "") in ROLE_CHECKS or any(walk(d) for d in dep.dependencies)

    return walk(route.dependant)


def example(schema: dict[str, Any], schemas: dict[str, Any], depth: int = 0) -> Any:
    """A value of `schema`, from its fields' types and names (refs followed a few levels)."""
    if depth > 4:
        return None
    if "$ref" in schema:
        target = schemas.get(schema["$ref"].rsplit("/", 1)[-1], {})
        ex = target.get("examples") or [target.get("example")]
        return ex[0] if ex and ex[0] is not None else example(target, schemas, depth + 1)
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            options = [s for s in schema[key] if s.get("type") != "null"]
            return example(options[0] | {"title": schema.get("title", "")}, schemas, depth + 1) if options else None
    if "default" in schema and schema["default"] is not None:
        return schema["default"]
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        return {k: example(v | {"title": k}, schemas, depth + 1) for k, v in props.items()}
    if kind == "array":
        return [example(schema.get("items", {}), schemas, depth + 1)]
    if kind == "integer":
        return max(schema.get("minimum", 1), 1)
    if kind == "number":
        return 1.0
    if kind == "boolean":
        return False
    if kind == "string":
        key = str(schema.get("title", "")).lower().replace(" ", "_")
        return next((v for k, v in SAMPLES.items() if key == k or key.endswith("_" + k)), "string")
    return None
