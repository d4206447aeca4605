"""`tianji sg`: security groups and their rules (IPv4 and IPv6: a rule's ethertype)."""

from __future__ import annotations

from typing import Any

import typer

from tianjictl.main import call, done, resource, show

sg = resource("sg", "Security groups and their rules.")
SG_COLS = ["id", "name", "vpc_id", "is_default", "description"]
RULE_COLS = ["id", "direction", "ethertype", "protocol", "port_range_min", "port_range_max", "remote_cidr",
             "remote_group_id"]


@sg.command("create")
def sg_create(ctx: typer.Context, name: str, vpc_id: str = typer.Option(..., "--vpc", help="the VPC's name or id"),
              description: str = typer.Option("", help="what the group is for"),
              no_egress: bool = typer.Option(False, "--no-egress", help="no rules at all (by default a new group "
                                                                        "allows all egress)")) -> None:
    body = {"vpc_id": vpc_id, "name": name, "description": description} | ({"rules": []} if no_egress else {})
    show(ctx, call(ctx, "POST", "/v1/security-groups", body), SG_COLS)


@sg.command("list")
def sg_list(ctx: typer.Context, vpc_id: str = typer.Option(None, "--vpc"),
            tag: str = typer.Option(None, help="only those with this tag")) -> None:
    show(ctx, call(ctx, "GET", "/v1/security-groups", vpc_id=vpc_id, tag=tag), SG_COLS, "security groups")


@sg.command("show")
def sg_show(ctx: typer.Context, sg_id: str) -> None:
    g = call(ctx, "GET", f"/v1/security-groups/{sg_id}")
    show(ctx, g, SG_COLS)
    if ctx.obj.output == "table":
        show(ctx, g["rules"], RULE_COLS, f"rules of {g['name']}")


@sg.command("delete")
def sg_delete(ctx: typer.Context, sg_id: str) -> None:
    call(ctx, "DELETE", f"/v1/security-groups/{sg_id}")
    done(ctx, f"deleted security group {sg_id}", deleted=sg_id)


@sg.command("rule-add")
def sg_rule_add(ctx: typer.Context, sg_id: str,
                direction: str = typer.Option(..., help="ingress|egress"),
                protocol: str = typer.Option("any", help="tcp|udp|icmp|any (icmp: ICMPv6 with IPv6)"),
                ethertype: str = typer.Option(None, help="IPv4|IPv6 (default: the remote CIDR's, else IPv4)"),
                port: str = typer.Option(None, help="PORT or MIN-MAX (tcp/udp)"),
                remote_cidr: str = typer.Option(None), remote_group: str = typer.Option(None)) -> None:
    """Add a rule to a security group."""
    body: dict[str, Any] = {"direction": direction, "protocol": protocol}
    if ethertype:
        body["ethertype"] = ethertype
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
    """Remove a rule from a security group."""
    call(ctx, "DELETE", f"/v1/security-groups/{sg_id}/rules/{rule_id}")
    done(ctx, f"deleted rule {rule_id}", deleted=rule_id)
