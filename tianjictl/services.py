"""`tianji service` and `tianji endpoint`: services outside the VPCs (the operator's on the service network, or a
tenant's load balancer published to named tenants) and their endpoints in tenants' subnets."""

from __future__ import annotations

import typer

from tianjictl.main import call, done, resource, show

service = resource("service", "Services outside the VPCs that tenants reach through endpoints.")
endpoint = resource("endpoint", "A service's address and name in one of your subnets.")
SERVICE_COLS = ["id", "name", "kind", "ports", "proxy_protocol", "addresses", "allowed_tenants", "endpoints"]
ENDPOINT_COLS = ["id", "service_name", "vpc_id", "subnet_id", "address", "dns_name", "source_address",
                 "security_group_ids"]


def _ports(specs: list[str]) -> list[dict]:
    out = []
    for s in specs:
        proto, _, port = s.partition("/")
        if not port.isdigit() or proto not in ("tcp", "udp"):
            raise typer.BadParameter(f"{s!r}: give PROTOCOL/PORT, e.g. tcp/443", param_hint="--port")
        out.append({"protocol": proto, "port": int(port)})
    return out


@service.command("create")
def service_create(ctx: typer.Context, name: str = typer.Argument(None, help="a DNS label: <name>.<vpc>.internal"),
                   address: list[str] = typer.Option([], "--address", help="on the service network (repeatable; "
                                                                           "the operator's services)"),
                   port: list[str] = typer.Option([], "--port", help="PROTOCOL/PORT, e.g. tcp/443 (repeatable)"),
                   proxy_protocol: bool = typer.Option(False, "--proxy-protocol/--no-proxy-protocol"),
                   load_balancer: str = typer.Option(None, "--load-balancer", help="publish your load balancer"),
                   allow: list[str] = typer.Option(None, "--allow", help="a tenant id that may use it "
                                                                         "(repeatable; default: every tenant)")) \
        -> None:
    body: dict = {"proxy_protocol": proxy_protocol}
    if name:
        body["name"] = name
    if load_balancer:
        body["load_balancer_id"] = load_balancer
        body["allowed_tenants"] = allow or []
    else:
        body |= {"addresses": address, "ports": _ports(port)}
        if allow is not None:
            body["allowed_tenants"] = allow
    show(ctx, call(ctx, "POST", "/v1/services", body), SERVICE_COLS)


@service.command("list")
def service_list(ctx: typer.Context) -> None:
    show(ctx, call(ctx, "GET", "/v1/services"), SERVICE_COLS, "services")


@service.command("show")
def service_show(ctx: typer.Context, service_id: str) -> None:
    show(ctx, call(ctx, "GET", f"/v1/services/{service_id}"), SERVICE_COLS + ["owner_tenant_id", "load_balancer_id"])


@service.command("allow")
def service_allow(ctx: typer.Context, service_id: str,
                  tenant: list[str] = typer.Option([], "--tenant", help="a tenant id (repeatable; none: nobody)"),
                  everyone: bool = typer.Option(False, "--everyone", help="every tenant (the operator's only)")) \
        -> None:
    """Who may use the service: exactly these tenants (or every tenant)."""
    body = {"allowed_tenants": None if everyone else tenant}
    show(ctx, call(ctx, "PATCH", f"/v1/services/{service_id}", body), SERVICE_COLS)


@service.command("delete")
def service_delete(ctx: typer.Context, service_id: str) -> None:
    call(ctx, "DELETE", f"/v1/services/{service_id}")
    done(ctx, f"deleted service {service_id}", deleted=service_id)


@endpoint.command("create")
def endpoint_create(ctx: typer.Context, service_id: str = typer.Option(..., "--service"),
                    vpc_id: str = typer.Option(..., "--vpc"), subnet_id: str = typer.Option(..., "--subnet"),
                    ip: str = typer.Option(None, help="an address of the subnet (default: the next free one)"),
                    group: list[str] = typer.Option(None, "--security-group", help="repeatable (default: the "
                                                                                   "VPC's default group)")) -> None:
    body: dict = {"service_id": service_id, "vpc_id": vpc_id, "subnet_id": subnet_id}
    if ip:
        body["ip"] = ip
    if group is not None:
        body["security_group_ids"] = group
    show(ctx, call(ctx, "POST", "/v1/service-endpoints", body), ENDPOINT_COLS)


@endpoint.command("list")
def endpoint_list(ctx: typer.Context) -> None:
    show(ctx, call(ctx, "GET", "/v1/service-endpoints"), ENDPOINT_COLS, "service endpoints")


@endpoint.command("delete")
def endpoint_delete(ctx: typer.Context, endpoint_id: str) -> None:
    call(ctx, "DELETE", f"/v1/service-endpoints/{endpoint_id}")
    done(ctx, f"deleted endpoint {endpoint_id} (its address is the subnet's again)", deleted=endpoint_id)
