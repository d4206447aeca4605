"""`tianji` commands for tenants' networks: VPCs, subnets, ports, peerings, routes, EIPs, NAT gateways (security
groups: groups.py)."""

from __future__ import annotations

from typing import Any

import typer

from tianjictl.main import call, done, fail, resource, show
from tianjictl.output import INVALID, err

vpc = resource("vpc", "VPCs: isolated tenant networks, one VNI each.")
VPC_COLS = ["id", "name", "cidr", "ipv6_cidr", "vni", "mtu", "tags", "tenant_id"]
TAG_HELP = "a tag (repeatable): replaces the tags"


def labels(description: str | None, tags: list[str] | None, no_tags: bool = False) -> dict[str, Any]:
    """The description and tags a command was given, as the API takes them."""
    out: dict[str, Any] = {}
    if description is not None:
        out["description"] = description
    if tags or no_tags:
        out["tags"] = [] if no_tags else tags
    return out


@vpc.command("create")
def vpc_create(ctx: typer.Context, name: str, cidr: str = typer.Option(..., help="e.g. 10.0.0.0/16"),
               mtu: int = typer.Option(None, help="the VMs' MTU (default 1450; up to the underlay's MTU less 50)"),
               ipv6_cidr: str = typer.Option(None, help='dual-stack: "auto" (a /56 of the operator\'s) or your /56'),
               tenant_id: str = typer.Option(None, help="admin only")) -> None:
    body = {"name": name, "cidr": cidr} | ({"tenant_id": tenant_id} if tenant_id else {}) | \
        ({"mtu": mtu} if mtu else {}) | ({"ipv6_cidr": ipv6_cidr} if ipv6_cidr else {})
    show(ctx, call(ctx, "POST", "/v1/vpcs", body), VPC_COLS)


@vpc.command("list")
def vpc_list(ctx: typer.Context, tag: str = typer.Option(None, help="only those with this tag")) -> None:
    show(ctx, call(ctx, "GET", "/v1/vpcs", tag=tag), VPC_COLS, "VPCs")


@vpc.command("show")
def vpc_show(ctx: typer.Context, vpc_id: str) -> None:
    show(ctx, call(ctx, "GET", f"/v1/vpcs/{vpc_id}"), VPC_COLS + ["router_mac", "default_security_group_id"])


@vpc.command("delete")
def vpc_delete(ctx: typer.Context, vpc_id: str) -> None:
    call(ctx, "DELETE", f"/v1/vpcs/{vpc_id}")
    done(ctx, f"deleted VPC {vpc_id}", deleted=vpc_id)


subnet = resource("subnet", "Subnets of a VPC.")
SUBNET_COLS = ["id", "name", "vpc_id", "cidr", "gateway_ip", "available_ips", "ipv6_cidr", "ipv6_address_mode"]


@subnet.command("create")
def subnet_create(ctx: typer.Context, name: str, vpc_id: str = typer.Option(..., "--vpc"),
                  cidr: str = typer.Option(...),
                  ipv6_cidr: str = typer.Option(None, help='dual-stack: "auto" or a /64 of the VPC\'s /56'),
                  ipv6_mode: str = typer.Option(None, help="slaac (default) | dhcpv6-stateful")) -> None:
    body = {"vpc_id": vpc_id, "name": name, "cidr": cidr} | ({"ipv6_cidr": ipv6_cidr} if ipv6_cidr else {}) | \
        ({"ipv6_address_mode": ipv6_mode} if ipv6_mode else {})
    show(ctx, call(ctx, "POST", "/v1/subnets", body), SUBNET_COLS)


@subnet.command("list")
def subnet_list(ctx: typer.Context, vpc_id: str = typer.Option(None, "--vpc"),
                tag: str = typer.Option(None, help="only those with this tag")) -> None:
    show(ctx, call(ctx, "GET", "/v1/subnets", vpc_id=vpc_id, tag=tag), SUBNET_COLS, "subnets")


@subnet.command("show")
def subnet_show(ctx: typer.Context, subnet_id: str) -> None:
    show(ctx, call(ctx, "GET", f"/v1/subnets/{subnet_id}"), SUBNET_COLS)


@subnet.command("delete")
def subnet_delete(ctx: typer.Context, subnet_id: str) -> None:
    call(ctx, "DELETE", f"/v1/subnets/{subnet_id}")
    done(ctx, f"deleted subnet {subnet_id}", deleted=subnet_id)


port = resource("port", "Ports: a VM's address in a subnet, bound to a host.")
PORT_COLS = ["id", "name", "ip", "ipv6", "mac", "host", "status", "security_group_ids"]


@port.command("create")
def port_create(ctx: typer.Context, name: str, subnet_id: str = typer.Option(..., "--subnet"),
                ip: str = typer.Option(None), ipv6: str = typer.Option(None, help="a dhcpv6-stateful subnet's"),
                mac: str = typer.Option(None), host: str = typer.Option(None),
                sg: list[str] = typer.Option(None, "--sg", help="security group id (repeatable)")) -> None:
    body: dict[str, Any] = {"subnet_id": subnet_id, "name": name}
    for k, v in (("ip", ip), ("ipv6", ipv6), ("mac", mac), ("host", host), ("security_group_ids", sg or None)):
        if v:
            body[k] = v
    show(ctx, call(ctx, "POST", "/v1/ports", body), PORT_COLS)


@port.command("list")
def port_list(ctx: typer.Context, vpc_id: str = typer.Option(None, "--vpc"),
              subnet_id: str = typer.Option(None, "--subnet"), host: str = typer.Option(None),
              tag: str = typer.Option(None, help="only those with this tag")) -> None:
    show(ctx, call(ctx, "GET", "/v1/ports", vpc_id=vpc_id, subnet_id=subnet_id, host=host, tag=tag), PORT_COLS,
         "ports")


@port.command("show")
def port_show(ctx: typer.Context, port_id: str) -> None:
    show(ctx, call(ctx, "GET", f"/v1/ports/{port_id}"), PORT_COLS + ["vpc_id", "subnet_id"])


@port.command("bind")
def port_bind(ctx: typer.Context, port_id: str, host: str) -> None:
    """Bind (or migrate) a port to a host."""
    show(ctx, call(ctx, "PATCH", f"/v1/ports/{port_id}", {"host": host}), PORT_COLS)


@port.command("migrate")
def port_migrate(ctx: typer.Context, port_id: str,
                 to: str = typer.Option(None, "--to", help="the destination host of a live migration"),
                 abandon: bool = typer.Option(False, "--abandon", help="the migration did not happen")) -> None:
    """Start a live migration: the port is bound on the destination too and its traffic sent to both hosts until
    `tianji port bind PORT DEST` ends it (or `--abandon`)."""
    if (to is None) != abandon:
        raise typer.BadParameter("give --to HOST to start a migration, or --abandon to drop one", param_hint="--to")
    show(ctx, call(ctx, "PATCH", f"/v1/ports/{port_id}", {"migrating_to": to}), [*PORT_COLS, "migrating_to"])


@port.command("update")
def port_update(ctx: typer.Context, port_id: str, name: str = typer.Option(None, help="a new name"),
                sg: list[str] = typer.Option(None, "--sg", help="security group name or id (repeatable): replaces "
                                                                "the port's groups"),
                no_groups: bool = typer.Option(False, "--no-groups", help="leave the port in no security group"),
                description: str = typer.Option(None), tag: list[str] = typer.Option(None, "--tag", help=TAG_HELP),
                no_tags: bool = typer.Option(False, "--no-tags", help="remove every tag")) -> None:
    """Rename a port, describe or tag it, or replace its security groups."""
    body: dict[str, Any] = labels(description, tag, no_tags)
    if name:
        body["name"] = name
    if sg or no_groups:
        body["security_group_ids"] = [] if no_groups else sg
    if not body:
        fail("give --name, --description, --tag, --sg or --no-groups: nothing to change", INVALID)
    show(ctx, call(ctx, "PATCH", f"/v1/ports/{port_id}", body), PORT_COLS)


@port.command("delete")
def port_delete(ctx: typer.Context, port_id: str) -> None:
    call(ctx, "DELETE", f"/v1/ports/{port_id}")
    done(ctx, f"deleted port {port_id}", deleted=port_id)


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
    done(ctx, f"deleted peering {peering_id}", deleted=peering_id)


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
                 destination: str = typer.Option(..., help="a CIDR, e.g. 0.0.0.0/0"),
                 target: str = typer.Option(..., help="peering:<id> or nat-gateway:<id>")) -> None:
    show(ctx, call(ctx, "POST", f"/v1/vpcs/{vpc_id}/routes", {"destination": destination, "target": target}),
         ROUTE_COLS)


@route.command("delete")
def route_delete(ctx: typer.Context, route_id: str, vpc_id: str = typer.Option(..., "--vpc")) -> None:
    call(ctx, "DELETE", f"/v1/vpcs/{vpc_id}/routes/{route_id}")
    done(ctx, f"deleted route {route_id}", deleted=route_id)


eip = resource("eip", "Elastic IPs: public addresses from the operator's pool.")
EIP_COLS = ["id", "address", "port_id", "tenant_id"]


@eip.command("create")
def eip_create(ctx: typer.Context) -> None:
    show(ctx, call(ctx, "POST", "/v1/eips", {}), EIP_COLS)


@eip.command("list")
def eip_list(ctx: typer.Context) -> None:
    show(ctx, call(ctx, "GET", "/v1/eips"), EIP_COLS, "EIPs")


@eip.command("show")
def eip_show(ctx: typer.Context, eip_id: str) -> None:
    """An EIP: its address, the port it is on and the gateway instance homing it."""
    show(ctx, call(ctx, "GET", f"/v1/eips/{eip_id}"), EIP_COLS + ["home"])


@eip.command("associate")
def eip_associate(ctx: typer.Context, eip_id: str, port_id: str = typer.Option(..., "--port")) -> None:
    show(ctx, call(ctx, "POST", f"/v1/eips/{eip_id}/associate", {"port_id": port_id}), EIP_COLS)


@eip.command("disassociate")
def eip_disassociate(ctx: typer.Context, eip_id: str) -> None:
    show(ctx, call(ctx, "POST", f"/v1/eips/{eip_id}/disassociate"), EIP_COLS)


@eip.command("delete")
def eip_delete(ctx: typer.Context, eip_id: str) -> None:
    call(ctx, "DELETE", f"/v1/eips/{eip_id}")
    done(ctx, f"released EIP {eip_id}", released=eip_id)


natgw = resource("nat-gateway", "NAT gateways: SNAT and DNAT for a VPC.")
NATGW_COLS = ["id", "name", "vpc_id", "eip_ids"]
SNAT_COLS = ["id", "cidr", "subnet_id", "eip_ids"]
DNAT_COLS = ["id", "eip_id", "protocol", "external_port", "port_id", "internal_port"]


@natgw.command("create")
def natgw_create(ctx: typer.Context, vpc_id: str = typer.Option(..., "--vpc"),
                 eips: list[str] = typer.Option(..., "--eip", help="EIP id (repeatable)"),
                 name: str = typer.Option("nat")) -> None:
    show(ctx, call(ctx, "POST", "/v1/nat-gateways", {"vpc_id": vpc_id, "name": name, "eip_ids": eips}), NATGW_COLS)


@natgw.command("list")
def natgw_list(ctx: typer.Context) -> None:
    show(ctx, call(ctx, "GET", "/v1/nat-gateways"), NATGW_COLS, "NAT gateways")


@natgw.command("show")
def natgw_show(ctx: typer.Context, gw_id: str) -> None:
    """A NAT gateway, its SNAT rules and its DNAT rules."""
    gw = call(ctx, "GET", f"/v1/nat-gateways/{gw_id}")
    if ctx.obj.output != "table":
        gw = gw | {"snat_rules": call(ctx, "GET", f"/v1/nat-gateways/{gw_id}/snat-rules"),
                   "dnat_rules": call(ctx, "GET", f"/v1/nat-gateways/{gw_id}/dnat-rules")}
        show(ctx, gw, NATGW_COLS)
        return
    show(ctx, gw, NATGW_COLS)
    show(ctx, call(ctx, "GET", f"/v1/nat-gateways/{gw_id}/snat-rules"), SNAT_COLS, "SNAT rules")
    show(ctx, call(ctx, "GET", f"/v1/nat-gateways/{gw_id}/dnat-rules"), DNAT_COLS, "DNAT rules")


@natgw.command("snat-list")
def natgw_snat_list(ctx: typer.Context, gw_id: str) -> None:
    """A NAT gateway's SNAT rules."""
    show(ctx, call(ctx, "GET", f"/v1/nat-gateways/{gw_id}/snat-rules"), SNAT_COLS, "SNAT rules")


@natgw.command("snat-delete")
def natgw_snat_delete(ctx: typer.Context, gw_id: str, rule_id: str) -> None:
    """Remove an SNAT rule."""
    call(ctx, "DELETE", f"/v1/nat-gateways/{gw_id}/snat-rules/{rule_id}")
    done(ctx, f"deleted SNAT rule {rule_id}", deleted=rule_id)


@natgw.command("dnat-list")
def natgw_dnat_list(ctx: typer.Context, gw_id: str) -> None:
    """A NAT gateway's DNAT rules."""
    show(ctx, call(ctx, "GET", f"/v1/nat-gateways/{gw_id}/dnat-rules"), DNAT_COLS, "DNAT rules")


@natgw.command("dnat-delete")
def natgw_dnat_delete(ctx: typer.Context, gw_id: str, rule_id: str) -> None:
    """Remove a DNAT rule."""
    call(ctx, "DELETE", f"/v1/nat-gateways/{gw_id}/dnat-rules/{rule_id}")
    done(ctx, f"deleted DNAT rule {rule_id}", deleted=rule_id)


@natgw.command("delete")
def natgw_delete(ctx: typer.Context, gw_id: str) -> None:
    call(ctx, "DELETE", f"/v1/nat-gateways/{gw_id}")
    done(ctx, f"deleted NAT gateway {gw_id}", deleted=gw_id)


@natgw.command("snat-add")
def natgw_snat(ctx: typer.Context, gw_id: str, subnet_id: str = typer.Option(None, "--subnet"),
               cidr: str = typer.Option(None), eips: list[str] = typer.Option(..., "--eip")) -> None:
    """Add an SNAT rule: a subnet or CIDR leaves through these EIPs."""
    body: dict[str, Any] = {"eip_ids": eips} | ({"subnet_id": subnet_id} if subnet_id else {"cidr": cidr})
    rule = call(ctx, "POST", f"/v1/nat-gateways/{gw_id}/snat-rules", body)
    show(ctx, rule, SNAT_COLS)
    if ctx.obj.output == "table":
        for w in rule.get("warnings", []):
            err.print(f"[yellow]warning:[/yellow] {w}", highlight=False)


@natgw.command("dnat-add")
def natgw_dnat(ctx: typer.Context, gw_id: str, eip_id: str = typer.Option(..., "--eip"),
               protocol: str = typer.Option("tcp"), external_port: int = typer.Option(...),
               port_id: str = typer.Option(..., "--port"), internal_port: int = typer.Option(...)) -> None:
    """Add a DNAT rule: an EIP's port forwards to a port's."""
    show(ctx, call(ctx, "POST", f"/v1/nat-gateways/{gw_id}/dnat-rules",
                   {"eip_id": eip_id, "protocol": protocol, "external_port": external_port, "port_id": port_id,
                    "internal_port": internal_port}), DNAT_COLS)
