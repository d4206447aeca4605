"""`tianji trace SRC DST`: the reachability analyzer (POST /v1/reachability) from the command line."""

from __future__ import annotations

import ipaddress
from typing import Any

import typer

from tianjictl.main import app, call, console, fail, show
from tianjictl.names import UUID
from tianjictl.output import ERROR, INVALID, NOT_FOUND, TRACE_UNREACHABLE


def _is_address(s: str) -> bool:
    try:
        ipaddress.IPv4Address(s)
    except ValueError:
        return False
    return True


def port_ref(ctx: typer.Context, ref: str, what: str) -> str:
    """A port's id from its id or its name (a name must be unique among the ports the caller sees)."""
    found = call(ctx, "GET", "/v1/ports", name=ref)
    if len(found) == 1:
        return found[0]["id"]
    if len(found) > 1:
        fail(f"{what}: {len(found)} ports are named {ref!r}: {'; '.join(f['id'] for f in found)}; give one's id",
             INVALID)
    if not UUID.match(ref):
        fail(f"{what}: no port named {ref!r} (nor an address)" if what == "destination" else
             f"{what}: no port named {ref!r}", NOT_FOUND)
    return ref  # an id (the controller says if it is no port of the caller's)


@app.command("trace")
def trace(ctx: typer.Context,
          source: str = typer.Argument(..., help="the source port (id or name)"),
          destination: str = typer.Argument(..., help="an IPv4 address or a port (id or name)"),
          proto: str = typer.Option(None, "--proto", help="tcp, udp or icmp (default: tcp with --port, else "
                                                          "icmp)"),
          port: int = typer.Option(None, "--port", help="the destination port (tcp, udp)"),
          eip: bool = typer.Option(False, "--eip", help="DESTINATION is an elastic IP's address"),
          live: bool = typer.Option(False, "--live", help="admin: also ask the source host's Open vSwitch "
                                                          "(ofproto/trace, through its agent) whether it agrees")) \
        -> None:
    """Whether SOURCE's packets reach DESTINATION, and the path hop by hop: the security group rule, route and
    port that decide on each host, and each gateway's translation. Exit status 0: reachable, 8: unreachable."""
    proto = proto or ("tcp" if port is not None else "icmp")
    if proto in ("tcp", "udp") and port is None:
        fail(f"--port is needed for {proto}: the destination port (or --proto icmp)", INVALID)
    if _is_address(destination):
        dst = {"eip" if eip else "ip": destination}
    elif eip:
        fail("--eip: DESTINATION must be an address", INVALID)
        return
    else:
        dst = {"port_id": port_ref(ctx, destination, "destination")}
    body: dict[str, Any] = {"source_port_id": port_ref(ctx, source, "source"), "destination": dst,
                            "protocol": proto}
    if port is not None:
        body["port"] = port
    if live:
        body["live"] = True
    a = call(ctx, "POST", "/v1/reachability", body)
    if ctx.obj.output == "table":
        render(a)
    else:
        show(ctx, a, ["verdict", "reason"])
    if live and a.get("live", {}).get("agrees") is False:
        raise typer.Exit(ERROR)  # the switch disagrees: a bug, whatever the verdict
    raise typer.Exit(0 if a["verdict"] == "reachable" else TRACE_UNREACHABLE)


def render(a: dict) -> None:
    colour = "green" if a["verdict"] == "reachable" else "red"
    what = a["protocol"] + (f"/{a['port']}" if a["port"] else "")
    console.print(f"[bold {colour}]{a['verdict'].upper()}[/]  {a['source']['ip']} -> {a['destination']['ip']} "
                  f"{what}: {a['reason']}", highlight=False)
    for leg in ("forward", "reply"):
        if a[leg] is None:
            continue
        console.print(f"[bold]{leg}[/] ({a[leg]['end']})")
        for h in a[leg]["hops"]:
            label = h["kind"] + (f" {h['role']}" if h["role"] else "")
            vni = f", VNI {h['vni']}" if h["vni"] is not None else ""
            console.print(f"  [cyan]{h['host']}[/] ({label}{vni})", highlight=False)
            for s in h["steps"]:
                mark = "[red]x[/]" if s["does"].endswith(": dropped") else "-"
                console.print(f"    {mark} {s['table']:<17} {s['does']}", highlight=False)
    if (lv := a.get("live")) is not None:
        said = {True: "[green]the switch agrees[/]", False: "[red]THE SWITCH DISAGREES[/]",
                None: "[yellow]not asked[/]"}
        console.print(f"[bold]live[/] ({lv['host']}): {said[lv['agrees']]}: model: {lv['model']}; switch: "
                      f"{lv['switch'] or '-'}", highlight=False)
        if lv.get("note"):
            console.print(f"  {lv['note']}", highlight=False)
