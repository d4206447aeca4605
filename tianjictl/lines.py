"""`tianji private-line`: a customer's data center into a VPC over a VLAN of the handoff, with BGP."""

from __future__ import annotations

import typer
from rich.table import Table

from tianjictl.main import call, console, done, resource, show

line = resource("private-line", "Private lines: an on-premise site into a VPC over an 802.1Q VLAN, with BGP.")
LINE_COLS = ["id", "name", "vpc_id", "vlan_id", "customer_asn", "local_asn", "local_ip", "customer_ip",
             "max_prefixes", "static_routes"]


@line.command("create")
def line_create(ctx: typer.Context, name: str, vpc_id: str = typer.Option(..., "--vpc"),
                vlan: int = typer.Option(..., help="the line's 802.1Q VLAN on the handoff (1-4094)"),
                customer_asn: int = typer.Option(..., "--customer-asn"),
                customer_ip: str = typer.Option(..., "--customer-ip", help="e.g. 169.254.10.2/30"),
                local_ip: str = typer.Option(..., "--local-ip", help="the cloud's end, e.g. 169.254.10.1/30"),
                secondary_local_ip: str = typer.Option(None, "--secondary-local-ip",
                                                       help="the redundant pair's cloud end (another /30)"),
                secondary_customer_ip: str = typer.Option(None, "--secondary-customer-ip"),
                md5_password: str = typer.Option(None, "--md5-password", envvar="TIANJI_LINE_MD5"),
                max_prefixes: int = typer.Option(100, "--max-prefixes"),
                static_route: list[str] = typer.Option([], "--static-route", help="a customer prefix without BGP "
                                                                                  "(repeatable)")) -> None:
    body: dict = {"name": name, "vpc_id": vpc_id, "vlan_id": vlan, "customer_asn": customer_asn,
                  "customer_ip": customer_ip, "local_ip": local_ip, "max_prefixes": max_prefixes,
                  "static_routes": static_route}
    if md5_password:
        body["md5_password"] = md5_password
    if secondary_local_ip or secondary_customer_ip:
        body["secondary"] = {"local_ip": secondary_local_ip, "customer_ip": secondary_customer_ip}
    show(ctx, call(ctx, "POST", "/v1/private-lines", body), LINE_COLS)


@line.command("list")
def line_list(ctx: typer.Context) -> None:
    show(ctx, call(ctx, "GET", "/v1/private-lines"), LINE_COLS, "private lines")


@line.command("show")
def line_show(ctx: typer.Context, line_id: str) -> None:
    """The line, each BGP session's state on its instance, and the routes learned."""
    x = call(ctx, "GET", f"/v1/private-lines/{line_id}")
    if ctx.obj.output != "table":
        show(ctx, x, [])
        return
    show(ctx, x, LINE_COLS + ["advertised"])
    t = Table(title="sessions", header_style="bold cyan")
    for c in ("instance", "session", "BGP", "BFD", "received", "accepted", "advertised", "refused", "last error"):
        t.add_column(c, overflow="fold")
    for s in x["sessions"]:
        t.add_row(s["instance"] or "-", f"{s['local_ip']} -> {s['customer_ip']}", s["bgp_state"], s["bfd_state"],
                  str(s["received"]), str(s["accepted"]), str(s["advertised"]),
                  ", ".join(f"{r['prefix']} ({r['reason']})" for r in s["refused"]), s["last_error"] or "")
    console.print(t)
    show(ctx, x["learned_routes"], ["prefix", "instances"], "learned routes (origin bgp)")


@line.command("update")
def line_update(ctx: typer.Context, line_id: str, max_prefixes: int = typer.Option(None, "--max-prefixes"),
                md5_password: str = typer.Option(None, "--md5-password", envvar="TIANJI_LINE_MD5"),
                static_route: list[str] = typer.Option(None, "--static-route")) -> None:
    body: dict = {}
    if max_prefixes is not None:
        body["max_prefixes"] = max_prefixes
    if md5_password is not None:
        body["md5_password"] = md5_password
    if static_route is not None:
        body["static_routes"] = static_route
    show(ctx, call(ctx, "PATCH", f"/v1/private-lines/{line_id}", body), LINE_COLS)


@line.command("rebalance")
def line_rebalance(ctx: typer.Context, line_id: str) -> None:
    """(admin) Move the line's sessions back to their home instances: sessions otherwise stay where they run while
    their instance lives. A session that moves is down for about a second; a redundant pair's other carries."""
    show(ctx, call(ctx, "POST", f"/v1/private-lines/{line_id}/rebalance", {}), LINE_COLS)


@line.command("delete")
def line_delete(ctx: typer.Context, line_id: str) -> None:
    call(ctx, "DELETE", f"/v1/private-lines/{line_id}")
    done(ctx, f"deleted private line {line_id} (its sessions go down, its routes with them)", deleted=line_id)
