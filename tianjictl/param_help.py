"""A help line for every option and argument: the ones a parameter's name says well enough are written once here
(`--vpc`, `--state-dir`, `rule_id`...) and given to every command that takes one without its own help line; the
rest are written where they are declared. `tests/api/test_cli_conventions.py` holds every parameter to having one."""

from __future__ import annotations

import inspect
from typing import Any

import typer
from typer.models import ArgumentInfo, OptionInfo

# a parameter's name -> its help line; "{what}" is the command group's resource ("the VPC's name")
BY_NAME = {
    "name": "{what}'s name", "vm_name": "the VM's name", "description": "free text: what it is for",
    "vpc_id": "the VPC (name or id)", "subnet_id": "the subnet (name or id)", "port_id": "the port (name or id)",
    "eip_id": "the EIP (address or id)", "eips": "an EIP (address or id; repeatable)",
    "pool_id": "the pool (name or id)", "service_id": "the service (name or id)",
    "tenant_id": "the tenant (name or id)",
    "peering_id": "the peering's id", "route_id": "the route's id (tianji route list)",
    "rule_id": "the rule's id", "listener_id": "the listener's id", "member_id": "the member's id",
    "endpoint_id": "the endpoint's id", "token_id": "the token's id", "credential_id": "the credential's id",
    "credential": "the credential's id or name", "host": "the hypervisor's name", "host_name": "the host's name",
    "vtep_ip": "the host's VTEP address on the underlay", "kind": "hypervisor or gateway",
    "cidr": "an IPv4 CIDR, e.g. 10.0.1.0/24", "ip": "a fixed address in the subnet (default: the next free)",
    "mac": "a fixed MAC (default: one made from the address)", "remote_cidr": "from/to this CIDR",
    "remote_group": "from/to members of this security group (name or id)", "protocol": "tcp or udp",
    "external_port": "the EIP's port", "internal_port": "the port's port", "port": "a TCP or UDP port",
    "protocol_port": "the member's port", "weight": "its share of new connections (1-256)",
    "idle_timeout_s": "seconds an idle connection is kept", "deregistration_delay_s":
    "seconds a removed member keeps its connections", "interval_s": "seconds between probes",
    "timeout_s": "seconds a probe may take", "rise": "probes passed before a member is up",
    "fall": "probes failed before a member is down", "http_method": "the probe's method (http)",
    "url_path": "the probe's path (http)", "expected_codes": "status codes that pass, e.g. 200 or 200-299",
    "customer_asn": "the site's AS number", "secondary_customer_ip": "the site router's address on the second "
    "handoff (two sessions)", "md5_password": "the BGP session's TCP MD5 password (RFC 2385)",
    "max_prefixes": "the most prefixes the site may announce (more: the session is reset)",
    "static_route": "a site prefix routed without BGP (repeatable)", "proxy_protocol":
    "send a PROXY v2 header with each connection's source (the service must expect it)",
    "limit": "at most this many entries", "url": "the controller's URL", "token": "a bearer token",
    "log_level": "debug, info, warning or error", "state_dir": "where its state files are",
    "as_json": "JSON instead of a table", "database_url": "postgresql+psycopg://... (default: SQLite)",
    "role": "nat, lb, private-line or service", "underlay_if": "the interface on the underlay",
}
# (a command group, a parameter) -> its help line, where the name alone says something else
IN_GROUP = {("cluster", "name"): "the cluster's name", ("cluster", "state_dir"): "where the clusters' state is",
            ("cluster", "host"): "the hypervisor's name", ("lb", "port"): "the listener's TCP port",
            ("tenant", "name"): "the tenant's name (unique)"}
SAID = {"vpc": "the VPC", "sg": "the security group", "lb": "the load balancer", "nat-gateway": "the NAT gateway",
        "private-line": "the private line", "tenant": "the tenant", "credential": "the credential",
        "host": "the host", "gateway": "the gateway instance", "subnet": "the subnet", "port": "the port"}


def help_for(group: str, name: str) -> str | None:
    if (group, name) in IN_GROUP:
        return IN_GROUP[(group, name)]
    text = BY_NAME.get(name)
    return None if text is None else text.format(what=SAID.get(group, f"the {group}"))


def fill(app: typer.Typer, group: str = "") -> None:
    """Give a help line to every option and argument of `app`'s commands (and its groups') that has none."""
    for c in app.registered_commands:
        _fill_callback(c.callback, group or (c.name or ""))
    for g in app.registered_groups:
        if g.typer_instance is not None:
            fill(g.typer_instance, group if group == "cluster" else (g.name or group))


def _fill_callback(fn: Any, group: str) -> None:
    """Options and arguments declared with typer.Option/Argument get the line in place; a bare positional
    parameter becomes an Argument with it (the callback's signature says so: typer reads the signature)."""
    if fn is None:
        return
    sig = inspect.signature(fn)
    params, changed = [], False
    for p in sig.parameters.values():
        info, text = p.default, help_for(group, p.name)
        if isinstance(info, OptionInfo | ArgumentInfo) and not (info.help or "").strip() and text:
            info.help = text
        elif info is inspect.Parameter.empty and text and p.annotation not in (typer.Context, "typer.Context"):
            p, changed = p.replace(default=typer.Argument(..., help=text)), True
        params.append(p)
    if changed:
        try:
            fn.__signature__ = sig.replace(parameters=params)
        except ValueError:  # a parameter with no default after one with: leave this command as declared
            pass


__all__ = ["fill", "help_for"]
