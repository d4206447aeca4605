"""`tianji`: one command line for every component."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from controller.client import ApiFailure, Client, load_cli_config

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Tianji: VPC networking for private GPU clouds.")
console = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True)

controller_app = typer.Typer(no_args_is_help=True, help="Run the central controller.")
app.add_typer(controller_app, name="controller")


@controller_app.command("serve")
def serve(host: str = typer.Option("127.0.0.1", help="address to listen on"),
          port: int = typer.Option(8080, help="TCP port"),
          state_dir: Path = typer.Option(None, envvar="TIANJI_STATE_DIR",
                                         help="holds the SQLite database and admin.token"),
          database_url: str = typer.Option(None, envvar="TIANJI_DATABASE_URL",
                                           help="postgresql+psycopg://... (default: SQLite in the state dir)"),
          host_down_after: float = typer.Option(None, help="seconds of heartbeat silence before a host is down"),
          workers: int = typer.Option(1, help="worker processes (PostgreSQL: use one per core)"),
          log_level: str = typer.Option("info")) -> None:
    """Start the controller: REST API under /v1, OpenAPI at /docs."""
    import logging

    import uvicorn

    from controller.app import create_app
    from controller.serving import server_options
    from controller.settings import Settings

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env(state_dir=state_dir, database_url=database_url, host_down_after=host_down_after)
    api = create_app(settings)  # migrates and creates the admin token once, before any worker starts
    where = settings.database_url.split("@")[-1] if settings.database_url else settings.url
    console.print(f"tianji controller: http://{host}:{port}  database: {where}  state: {settings.state_dir}"
                  + (f"  workers: {workers}" if workers > 1 else ""))
    if workers > 1:
        os.environ["TIANJI_STATE_DIR"] = str(settings.state_dir)
        if settings.database_url:
            os.environ["TIANJI_DATABASE_URL"] = settings.database_url
        if host_down_after is not None:
            os.environ["TIANJI_HOST_DOWN_AFTER"] = str(host_down_after)
        uvicorn.run("controller.app:app_from_env", factory=True, workers=workers, host=host, port=port,
                    log_level=log_level.lower(), timeout_graceful_shutdown=2, **server_options())
    else:
        uvicorn.run(api, host=host, port=port, log_level=log_level.lower(), timeout_graceful_shutdown=2,
                    **server_options())


# --- API client commands ------------------------------------------------------------------------------

class Ctx:
    def __init__(self, url: str, token: str | None, as_json: bool) -> None:
        self.url, self.token, self.as_json = url, token, as_json

    def client(self) -> Client:
        if not self.token:
            fail("no token: pass --token, set TIANJI_TOKEN, or save one with `tianji login`")
        return Client(self.url, self.token)


def fail(msg: str, code: int = 1) -> None:
    err.print(f"[red]error:[/red] {msg}")
    raise typer.Exit(code)


@app.callback()
def main_options(ctx: typer.Context,
                 url: str = typer.Option(None, envvar="TIANJI_URL", help="controller URL"),
                 token: str = typer.Option(None, envvar="TIANJI_TOKEN", help="bearer token"),
                 as_json: bool = typer.Option(False, "--json", help="print JSON instead of tables")) -> None:
    cfg = load_cli_config()
    token = token or cfg.get("token")
    if not token and not cfg.get("token"):
        state = Path(os.environ.get("TIANJI_STATE_DIR", "")) / "admin.token"
        if os.environ.get("TIANJI_STATE_DIR") and state.exists():
            token = state.read_text().strip()
    ctx.obj = Ctx(url or cfg.get("url") or "http://127.0.0.1:8080", token, as_json)


def call(ctx: typer.Context, method: str, path: str, body: Any = None, **params: Any) -> Any:
    try:
        return ctx.obj.client().request(method, path, body, **params)
    except ApiFailure as e:
        where = f" (field: {e.field})" if e.field else ""
        fail(f"{e.detail}{where}" if e.status else e.detail)


def show(ctx: typer.Context, rows: Any, columns: list[str], title: str | None = None) -> None:
    if ctx.obj.as_json:
        console.print_json(json.dumps(rows))
        return
    rows = rows if isinstance(rows, list) else [rows]
    t = Table(title=title, header_style="bold cyan")
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*("" if r.get(c) is None else ", ".join(map(str, r[c])) if isinstance(r.get(c), list)
                    else str(r[c]) for c in columns))
    console.print(t)


@app.command("login")
def login(url: str = typer.Option(...), token: str = typer.Option(...)) -> None:
    """Save the controller URL and a token for later commands (~/.config/tianji/cli.json, mode 0600)."""
    from controller.client import CONFIG_FILE

    Client(url, token).get("/v1/whoami")
    CONFIG_FILE.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(CONFIG_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": url, "token": token}, f)
    console.print(f"saved to {CONFIG_FILE}")


def resource(name: str, help_: str) -> typer.Typer:
    sub = typer.Typer(no_args_is_help=True, help=help_)
    app.add_typer(sub, name=name)
    return sub


tenant = resource("tenant", "Tenants (admin).")
TENANT_COLS = ["id", "name", "token"]


@tenant.command("create")
def tenant_create(ctx: typer.Context, name: str) -> None:
    show(ctx, call(ctx, "POST", "/v1/tenants", {"name": name}), TENANT_COLS, "tenant (keep the token: shown once)")


@tenant.command("list")
def tenant_list(ctx: typer.Context) -> None:
    show(ctx, call(ctx, "GET", "/v1/tenants"), ["id", "name"])


@tenant.command("delete")
def tenant_delete(ctx: typer.Context, tenant_id: str) -> None:
    call(ctx, "DELETE", f"/v1/tenants/{tenant_id}")
    console.print(f"deleted tenant {tenant_id}")


@tenant.command("token-create")
def tenant_token_create(ctx: typer.Context, tenant_id: str, name: str = typer.Option(None)) -> None:
    """A further token for the tenant (rotation: hand it out, then revoke the old one)."""
    show(ctx, call(ctx, "POST", f"/v1/tenants/{tenant_id}/tokens", {"name": name}), ["id", "name", "token"],
         "token (keep it: shown once)")


@tenant.command("token-list")
def tenant_token_list(ctx: typer.Context, tenant_id: str) -> None:
    show(ctx, call(ctx, "GET", f"/v1/tenants/{tenant_id}/tokens"), ["id", "name", "created_at"], "tokens")


@tenant.command("token-revoke")
def tenant_token_revoke(ctx: typer.Context, tenant_id: str, token_id: str) -> None:
    call(ctx, "DELETE", f"/v1/tenants/{tenant_id}/tokens/{token_id}")
    console.print(f"revoked token {token_id}")


@tenant.command("quota")
def tenant_quota(ctx: typer.Context, tenant_id: str,
                 set_: list[str] = typer.Option(None, "--set",
                                                help="RESOURCE=LIMIT (-1 unlimited, 'default')")) -> None:
    """Show a tenant's quotas and usage; with --set (admin), change them."""
    if set_:
        body: dict[str, int | None] = {}
        for item in set_:
            k, sep, v = item.partition("=")
            if not sep:
                fail(f"--set {item!r}: write RESOURCE=LIMIT, e.g. --set vpcs=100")
            body[k.replace("-", "_")] = None if v == "default" else int(v) if v.lstrip("-").isdigit() else \
                fail(f"--set {item!r}: LIMIT is a number, -1 (unlimited) or 'default'")
        got = call(ctx, "PUT", f"/v1/tenants/{tenant_id}/quotas", body)
    else:
        got = call(ctx, "GET", f"/v1/tenants/{tenant_id}/quotas")
    rows = [{"resource": r, "used": q["used"], "limit": "unlimited" if q["limit"] < 0 else q["limit"]}
            for r, q in (got or {}).items()]
    show(ctx, rows if not ctx.obj.as_json else got, ["resource", "used", "limit"], "quotas")


credential = resource("credential", "Host and orchestrator credentials (admin).")
CRED_COLS = ["id", "name", "kind", "host", "created_at"]


@credential.command("host")
def credential_host(ctx: typer.Context, host_name: str, kind: str = typer.Option("hypervisor"),
                    name: str = typer.Option(None, help="the credential's name (default: the host's)")) -> None:
    """A token for one host: it registers, beats, reports and reads that host's config, nothing else."""
    show(ctx, call(ctx, "POST", "/v1/host-tokens", {"host": host_name, "kind": kind, "name": name}),
         CRED_COLS + ["token"], "credential (keep the token: shown once)")


@credential.command("orchestrator")
def credential_orchestrator(ctx: typer.Context, name: str = typer.Argument("orchestrator")) -> None:
    """A token for what places VMs: it creates and binds any tenant's ports to hosts, nothing else."""
    show(ctx, call(ctx, "POST", "/v1/orchestrator-tokens", {"name": name}), CRED_COLS + ["token"],
         "credential (keep the token: shown once)")


@credential.command("list")
def credential_list(ctx: typer.Context) -> None:
    show(ctx, call(ctx, "GET", "/v1/host-tokens"), CRED_COLS, "credentials")


@credential.command("revoke")
def credential_revoke(ctx: typer.Context, credential_id: str) -> None:
    call(ctx, "DELETE", f"/v1/host-tokens/{credential_id}")
    console.print(f"revoked credential {credential_id}")


@app.command("audit")
def audit(ctx: typer.Context, tenant_id: str = typer.Option(None, "--tenant"),
          limit: int = typer.Option(100)) -> None:
    """The audit log (admin): who wrote what, when, and the revision it made."""
    show(ctx, call(ctx, "GET", "/v1/audit", tenant_id=tenant_id, limit=limit),
         ["at", "actor_kind", "actor", "method", "path", "revision"], "audit log")


vpc = resource("vpc", "VPCs: isolated tenant networks, one VNI each.")
VPC_COLS = ["id", "name", "cidr", "vni", "tenant_id"]


@vpc.command("create")
def vpc_create(ctx: typer.Context, name: str, cidr: str = typer.Option(..., help="e.g. 10.0.0.0/16"),
               tenant_id: str = typer.Option(None, help="admin only")) -> None:
    body = {"name": name, "cidr": cidr} | ({"tenant_id": tenant_id} if tenant_id else {})
    show(ctx, call(ctx, "POST", "/v1/vpcs", body), VPC_COLS)


@vpc.command("list")
def vpc_list(ctx: typer.Context) -> None:
    show(ctx, call(ctx, "GET", "/v1/vpcs"), VPC_COLS, "VPCs")


@vpc.command("show")
def vpc_show(ctx: typer.Context, vpc_id: str) -> None:
    show(ctx, call(ctx, "GET", f"/v1/vpcs/{vpc_id}"), VPC_COLS + ["router_mac", "default_security_group_id"])


@vpc.command("delete")
def vpc_delete(ctx: typer.Context, vpc_id: str) -> None:
    call(ctx, "DELETE", f"/v1/vpcs/{vpc_id}")
    console.print(f"deleted VPC {vpc_id}")


subnet = resource("subnet", "Subnets of a VPC.")
SUBNET_COLS = ["id", "name", "vpc_id", "cidr", "gateway_ip", "available_ips"]


@subnet.command("create")
def subnet_create(ctx: typer.Context, name: str, vpc_id: str = typer.Option(..., "--vpc"),
                  cidr: str = typer.Option(...)) -> None:
    show(ctx, call(ctx, "POST", "/v1/subnets", {"vpc_id": vpc_id, "name": name, "cidr": cidr}), SUBNET_COLS)


@subnet.command("list")
def subnet_list(ctx: typer.Context, vpc_id: str = typer.Option(None, "--vpc")) -> None:
    show(ctx, call(ctx, "GET", "/v1/subnets", vpc_id=vpc_id), SUBNET_COLS, "subnets")


@subnet.command("show")
def subnet_show(ctx: typer.Context, subnet_id: str) -> None:
    show(ctx, call(ctx, "GET", f"/v1/subnets/{subnet_id}"), SUBNET_COLS)


@subnet.command("delete")
def subnet_delete(ctx: typer.Context, subnet_id: str) -> None:
    call(ctx, "DELETE", f"/v1/subnets/{subnet_id}")
    console.print(f"deleted subnet {subnet_id}")


port = resource("port", "Ports: a VM's address in a subnet, bound to a host.")
PORT_COLS = ["id", "name", "ip", "mac", "host", "status", "security_group_ids"]


@port.command("create")
def port_create(ctx: typer.Context, name: str, subnet_id: str = typer.Option(..., "--subnet"),
                ip: str = typer.Option(None), mac: str = typer.Option(None), host: str = typer.Option(None),
                sg: list[str] = typer.Option(None, "--sg", help="security group id (repeatable)")) -> None:
    body: dict[str, Any] = {"subnet_id": subnet_id, "name": name}
    for k, v in (("ip", ip), ("mac", mac), ("host", host), ("security_group_ids", sg or None)):
        if v:
            body[k] = v
    show(ctx, call(ctx, "POST", "/v1/ports", body), PORT_COLS)


@port.command("list")
def port_list(ctx: typer.Context, vpc_id: str = typer.Option(None, "--vpc"),
              subnet_id: str = typer.Option(None, "--subnet"), host: str = typer.Option(None)) -> None:
    show(ctx, call(ctx, "GET", "/v1/ports", vpc_id=vpc_id, subnet_id=subnet_id, host=host), PORT_COLS, "ports")


@port.command("show")
def port_show(ctx: typer.Context, port_id: str) -> None:
    show(ctx, call(ctx, "GET", f"/v1/ports/{port_id}"), PORT_COLS + ["vpc_id", "subnet_id"])


@port.command("bind")
def port_bind(ctx: typer.Context, port_id: str, host: str) -> None:
    """Bind (or migrate) a port to a host."""
    show(ctx, call(ctx, "PATCH", f"/v1/ports/{port_id}", {"host": host}), PORT_COLS)


@port.command("delete")
def port_delete(ctx: typer.Context, port_id: str) -> None:
    call(ctx, "DELETE", f"/v1/ports/{port_id}")
    console.print(f"deleted port {port_id}")


peering = resource("peering", "VPC peering connections.")
PEERING_COLS = ["id", "requester_vpc_id", "accepter_vpc_id", "status"]


@peering.command("create")
def peering_create(ctx: typer.Context, requester: str = typer.Option(..., help="your VPC id"),
                   accepter: str = typer.Option(..., help="the peer VPC id")) -> None:
    show(ctx, call(ctx, "POST", "/v1/peerings", {"requester_vpc_id": requester, "accepter_vpc_id": accepter}),
         PEERING_COLS)


@peering.command("list")
def peering_list(ctx: typer.Context) -> None:
    show(ctx, call(ctx, "GET", "/v1/peerings"), PEERING_COLS, "peerings")


@peering.command("show")
def peering_show(ctx: typer.Context, peering_id: str) -> None:
    show(ctx, call(ctx, "GET", f"/v1/peerings/{peering_id}"), PEERING_COLS)


@peering.command("accept")
def peering_accept(ctx: typer.Context, peering_id: str) -> None:
    show(ctx, call(ctx, "POST", f"/v1/peerings/{peering_id}/accept"), PEERING_COLS)


@peering.command("reject")
def peering_reject(ctx: typer.Context, peering_id: str) -> None:
    show(ctx, call(ctx, "POST", f"/v1/peerings/{peering_id}/reject"), PEERING_COLS)


@peering.command("delete")
def peering_delete(ctx: typer.Context, peering_id: str) -> None:
    call(ctx, "DELETE", f"/v1/peerings/{peering_id}")
    console.print(f"deleted peering {peering_id}")


route = resource("route", "VPC route tables.")
ROUTE_COLS = ["destination", "target", "origin", "state", "id"]


@route.command("list")
def route_list(ctx: typer.Context, vpc_id: str = typer.Option(..., "--vpc")) -> None:
    show(ctx, call(ctx, "GET", f"/v1/vpcs/{vpc_id}/routes"), ROUTE_COLS, "route table")


@route.command("show")
def route_show(ctx: typer.Context, vpc_id: str = typer.Option(..., "--vpc")) -> None:
    route_list(ctx, vpc_id)


@route.command("create")
def route_create(ctx: typer.Context, vpc_id: str = typer.Option(..., "--vpc"),
                 destination: str = typer.Option(...), target: str = typer.Option(..., help="peering:<id>")) -> None:
    show(ctx, call(ctx, "POST", f"/v1/vpcs/{vpc_id}/routes", {"destination": destination, "target": target}),
         ROUTE_COLS)


@route.command("delete")
def route_delete(ctx: typer.Context, route_id: str, vpc_id: str = typer.Option(..., "--vpc")) -> None:
    call(ctx, "DELETE", f"/v1/vpcs/{vpc_id}/routes/{route_id}")
    console.print(f"deleted route {route_id}")


sg = resource("sg", "Security groups and their rules.")
SG_COLS = ["id", "name", "vpc_id", "is_default", "description"]
RULE_COLS = ["id", "direction", "protocol", "port_range_min", "port_range_max", "remote_cidr", "remote_group_id"]


@sg.command("create")
def sg_create(ctx: typer.Context, name: str, vpc_id: str = typer.Option(..., "--vpc"),
              description: str = typer.Option("")) -> None:
    show(ctx, call(ctx, "POST", "/v1/security-groups", {"vpc_id": vpc_id, "name": name,
                                                        "description": description}), SG_COLS)


@sg.command("list")
def sg_list(ctx: typer.Context, vpc_id: str = typer.Option(None, "--vpc")) -> None:
    show(ctx, call(ctx, "GET", "/v1/security-groups", vpc_id=vpc_id), SG_COLS, "security groups")


@sg.command("show")
def sg_show(ctx: typer.Context, sg_id: str) -> None:
    g = call(ctx, "GET", f"/v1/security-groups/{sg_id}")
    show(ctx, g, SG_COLS)
    if not ctx.obj.as_json:
        show(ctx, g["rules"], RULE_COLS, f"rules of {g['name']}")


@sg.command("delete")
def sg_delete(ctx: typer.Context, sg_id: str) -> None:
    call(ctx, "DELETE", f"/v1/security-groups/{sg_id}")
    console.print(f"deleted security group {sg_id}")


@sg.command("rule-add")
def sg_rule_add(ctx: typer.Context, sg_id: str,
                direction: str = typer.Option(..., help="ingress|egress"),
                protocol: str = typer.Option("any", help="tcp|udp|icmp|any"),
                port: str = typer.Option(None, help="PORT or MIN-MAX (tcp/udp)"),
                remote_cidr: str = typer.Option(None), remote_group: str = typer.Option(None)) -> None:
    body: dict[str, Any] = {"direction": direction, "protocol": protocol}
    if port:
        lo, _, hi = port.partition("-")
        body |= {"port_range_min": int(lo), "port_range_max": int(hi or lo)}
    if remote_cidr:
        body["remote_cidr"] = remote_cidr
    if remote_group:
        body["remote_group_id"] = remote_group
    show(ctx, call(ctx, "POST", f"/v1/security-groups/{sg_id}/rules", body), RULE_COLS)


@sg.command("rule-delete")
def sg_rule_delete(ctx: typer.Context, sg_id: str, rule_id: int) -> None:
    call(ctx, "DELETE", f"/v1/security-groups/{sg_id}/rules/{rule_id}")
    console.print(f"deleted rule {rule_id}")


eip = resource("eip", "Elastic IPs: public addresses from the operator's pool.")
EIP_COLS = ["id", "address", "port_id", "tenant_id"]


@eip.command("create")
def eip_create(ctx: typer.Context) -> None:
    show(ctx, call(ctx, "POST", "/v1/eips", {}), EIP_COLS)


@eip.command("list")
def eip_list(ctx: typer.Context) -> None:
    show(ctx, call(ctx, "GET", "/v1/eips"), EIP_COLS, "EIPs")


@eip.command("associate")
def eip_associate(ctx: typer.Context, eip_id: str, port_id: str = typer.Option(..., "--port")) -> None:
    show(ctx, call(ctx, "POST", f"/v1/eips/{eip_id}/associate", {"port_id": port_id}), EIP_COLS)


@eip.command("disassociate")
def eip_disassociate(ctx: typer.Context, eip_id: str) -> None:
    show(ctx, call(ctx, "POST", f"/v1/eips/{eip_id}/disassociate"), EIP_COLS)


@eip.command("delete")
def eip_delete(ctx: typer.Context, eip_id: str) -> None:
    call(ctx, "DELETE", f"/v1/eips/{eip_id}")
    console.print(f"released EIP {eip_id}")


natgw = resource("nat-gateway", "NAT gateways: SNAT and DNAT for a VPC.")
NATGW_COLS = ["id", "name", "vpc_id", "eip_ids"]


@natgw.command("create")
def natgw_create(ctx: typer.Context, vpc_id: str = typer.Option(..., "--vpc"),
                 eips: list[str] = typer.Option(..., "--eip", help="EIP id (repeatable)"),
                 name: str = typer.Option("nat")) -> None:
    show(ctx, call(ctx, "POST", "/v1/nat-gateways", {"vpc_id": vpc_id, "name": name, "eip_ids": eips}), NATGW_COLS)


@natgw.command("list")
def natgw_list(ctx: typer.Context) -> None:
    show(ctx, call(ctx, "GET", "/v1/nat-gateways"), NATGW_COLS, "NAT gateways")


@natgw.command("delete")
def natgw_delete(ctx: typer.Context, gw_id: str) -> None:
    call(ctx, "DELETE", f"/v1/nat-gateways/{gw_id}")
    console.print(f"deleted NAT gateway {gw_id}")


@natgw.command("snat-add")
def natgw_snat(ctx: typer.Context, gw_id: str, subnet_id: str = typer.Option(None, "--subnet"),
               cidr: str = typer.Option(None), eips: list[str] = typer.Option(..., "--eip")) -> None:
    body: dict[str, Any] = {"eip_ids": eips} | ({"subnet_id": subnet_id} if subnet_id else {"cidr": cidr})
    show(ctx, call(ctx, "POST", f"/v1/nat-gateways/{gw_id}/snat-rules", body), ["id", "cidr", "eip_ids"])


@natgw.command("dnat-add")
def natgw_dnat(ctx: typer.Context, gw_id: str, eip_id: str = typer.Option(..., "--eip"),
               protocol: str = typer.Option("tcp"), external_port: int = typer.Option(...),
               port_id: str = typer.Option(..., "--port"), internal_port: int = typer.Option(...)) -> None:
    show(ctx, call(ctx, "POST", f"/v1/nat-gateways/{gw_id}/dnat-rules",
                   {"eip_id": eip_id, "protocol": protocol, "external_port": external_port, "port_id": port_id,
                    "internal_port": internal_port}), ["id", "eip_id", "protocol", "external_port", "port_id",
                                                       "internal_port"])


host = resource("host", "Hypervisors and gateway hosts (admin).")
HOST_COLS = ["name", "vtep_ip", "kind", "status", "ports", "last_seen"]


@host.command("list")
def host_list(ctx: typer.Context) -> None:
    show(ctx, call(ctx, "GET", "/v1/hosts"), HOST_COLS, "hosts")


@host.command("register")
def host_register(ctx: typer.Context, name: str, vtep_ip: str = typer.Option(...),
                  kind: str = typer.Option("hypervisor")) -> None:
    show(ctx, call(ctx, "POST", "/v1/hosts", {"name": name, "vtep_ip": vtep_ip, "kind": kind}), HOST_COLS)


@host.command("move-vtep")
def host_move_vtep(ctx: typer.Context, name: str, vtep_ip: str) -> None:
    """Move a host's VTEP (admin): a host's own token cannot, so that a stolen one cannot redirect its traffic."""
    show(ctx, call(ctx, "PATCH", f"/v1/hosts/{name}", {"vtep_ip": vtep_ip}), HOST_COLS)


def _register_components() -> None:
    """Components that pull heavier dependencies (os-ken, pyroute2, Mininet) register lazily."""
    try:
        from vswitch_agent.cli import agent_app

        app.add_typer(agent_app, name="agent")
    except ImportError as e:  # pragma: no cover - only when the agent's dependencies are missing
        err.print(f"[yellow]note:[/yellow] `tianji agent` unavailable: {e}")
    try:
        from nfv_gateways.cli import gateway_app

        app.add_typer(gateway_app, name="gateway")
    except ImportError as e:  # pragma: no cover
        err.print(f"[yellow]note:[/yellow] `tianji gateway` unavailable: {e}")
    try:
        from topologies.cli import cluster_app

        app.add_typer(cluster_app, name="cluster")
    except ImportError as e:  # pragma: no cover - Mininet comes from Debian's python3-mininet
        err.print(f"[yellow]note:[/yellow] `tianji cluster` unavailable: {e} (apt-get install mininet)")


def main() -> None:
    _register_components()
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
