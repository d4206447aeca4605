"""`tianji gateway`: run an NFV gateway instance, or print its status."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from nfv_gateways.core.edge import EdgeSpec

gateway_app = typer.Typer(no_args_is_help=True, help="NFV gateway instances (roles: nat, lb, private-line, service).")
console = Console(width=None if sys.stdout.isatty() else 160, emoji=False)  # ":100:" in an IPv6 address is not an emoji
DEFAULT_STATE = Path("/run/tianji")


@gateway_app.command("run")
def run(role: str = typer.Option("nat"), name: str = typer.Option(...),
        controller: str = typer.Option("", envvar="TIANJI_URL", help="controller URL(s): URL,URL,... (replicas)"),
        token: str = typer.Option("", envvar="TIANJI_TOKEN"), underlay_if: str = typer.Option(...),
        ca: str = typer.Option(None, envvar="TIANJI_CA", help="verify the controller against this CA (PEM)"),
        cert: str = typer.Option(None, envvar="TIANJI_CERT", help="this host's certificate (mutual TLS)"),
        key: str = typer.Option(None, envvar="TIANJI_KEY", help="its private key"),
        vtep_ip: str = typer.Option(...), external_if: str = typer.Option("", help="roles nat, lb: the external "
                                                                                  "segment; service: the service "
                                                                                  "network"),
        handoff_if: str = typer.Option("", help="role private-line: where the customers' lines arrive, as "
                                                "802.1Q VLANs"),
        handoff_mtu: int = typer.Option(1500, help="role private-line: the handoff's MTU"),
        fastpath: str = typer.Option("auto", help="auto|dpdk|xdp|packet|python: auto takes the best that starts"),
        state_dir: Path = typer.Option(DEFAULT_STATE), metrics_port: int = typer.Option(9477, help="Prometheus"),
        config_file: Path = typer.Option(None, help="standalone: serve this GatewayConfig JSON, no controller"),
        beat_interval: float | None = typer.Option(None, help="seconds between heartbeats (default: as the "
                                                                  "controller asks: its gateway silence / 5)"),
        nat_mappings: int = typer.Option(1 << 18, help="role nat: mapping table slots in C (a power of two; 3/4 "
                                                       "of them are ever used)"),
        lb_connections: int = typer.Option(1 << 20, help="role lb: connection table slots (a power of two)"),
        lb_new_per_s: float = typer.Option(100_000.0, help="role lb: new connections remembered per second; "
                                                           "above it (a SYN flood) Maglev alone decides"),
        edge_local: str = typer.Option("", help="roles nat, lb: announce our addresses by BGP to an edge router, "
                                                "from this ADDRESS/LEN on the external segment"),
        edge_peer: str = typer.Option("", help="the edge router's address (also the way off the segment)"),
        edge_asn: int = typer.Option(64512, help="our AS number towards the edge router"),
        edge_peer_asn: int = typer.Option(64600, help="the edge router's AS number"),
        log_level: str = typer.Option("info")) -> None:
    """Run a gateway instance (a VTEP on the underlay; the external segment on --external-if)."""
    from nfv_gateways.core.instance import Instance
    from nfv_gateways.core.options import GatewayOptions
    from nfv_gateways.core.role import ROLES
    from tianji.tls import ClientTls

    if role not in ROLES:
        console.print(f"[red]error:[/red] role {role!r} is not available: choose one of {', '.join(sorted(ROLES))}")
        raise typer.Exit(2)
    if bad := [f"{flag} {n}" for flag, n in (("--nat-mappings", nat_mappings), ("--lb-connections", lb_connections))
               if n < 16 or n & (n - 1)]:
        console.print(f"[red]error:[/red] {', '.join(bad)}: a power of two, at least 16")
        raise typer.Exit(2)
    if role == "private-line":
        if not handoff_if:
            console.print("[red]error:[/red] --role private-line needs --handoff-if (the NIC the lines arrive on)")
            raise typer.Exit(2)
        external_if = handoff_if
    elif not external_if:
        console.print(f"[red]error:[/red] --role {role} needs --external-if (the external segment)")
        raise typer.Exit(2)
    edge = _edge_of(role, edge_local, edge_peer, edge_asn, edge_peer_asn)
    if config_file is None and not (controller and token):
        console.print("[red]error:[/red] give --controller and --token (or --config-file for a standalone instance)")
        raise typer.Exit(2)
    logging.basicConfig(level=log_level.upper(), format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s")
    Instance(GatewayOptions(name=name, controller=controller, token=token, underlay_if=underlay_if,
                            tls=ClientTls.from_env(ca, cert, key), vtep_ip=vtep_ip, external_if=external_if,
                            fastpath=fastpath, state_dir=state_dir, metrics_port=metrics_port,
                            config_file=config_file, beat_interval=beat_interval, nat_mappings=nat_mappings,
                            lb_connections=lb_connections, lb_new_per_s=lb_new_per_s, handoff_mtu=handoff_mtu,
                            edge=edge), role).run()


def _edge_of(role: str, local: str, peer: str, asn: int, peer_asn: int) -> EdgeSpec | None:
    """The edge-routing flags as a spec, or None; a clear error and exit code 2 when they are wrong."""
    from nfv_gateways.core.edge import parse_edge

    why = None
    if (local or peer) and role == "private-line":
        why = "--edge-local/--edge-peer are for roles nat and lb (a line has its own BGP)"
    elif bool(local) != bool(peer):
        why = "edge routing needs both --edge-local and --edge-peer"
    else:
        try:
            return parse_edge(local, peer, asn, peer_asn)
        except SystemExit as e:
            why = str(e)
    console.print(f"[red]error:[/red] {why}")
    raise typer.Exit(2)


@gateway_app.command("status")
def status(name: str, state_dir: Path = typer.Option(DEFAULT_STATE),
           as_json: bool = typer.Option(False, "--json")) -> None:
    """Counters, table sizes and the fast path of a local gateway instance."""
    try:
        st = json.loads((state_dir / f"gateway-{name}.json").read_text())
    except (OSError, ValueError):
        console.print(f"[red]error:[/red] no status for {name} in {state_dir}: is it running with --state-dir?")
        raise typer.Exit(1) from None
    if as_json:
        console.print_json(json.dumps(st))
        return
    held = f"{st['connections']} connections" if "connections" in st else f"{st.get('mappings', 0)} mappings"
    t = Table(title=f"gateway {name}: fast path {st['fastpath']}, revision {st['revision']}, {held}, "
                    f"EIPs {', '.join(st['eips'])}", header_style="bold cyan")
    t.add_column("counter")
    t.add_column("value", justify="right")
    rows = {"role": st.get("role", "nat"), "controller": st.get("controller"),
            "controller_failovers": st.get("controller_failovers", 0), **st["counters"],
            **{f"{part}.{k}": v for part in ("nat", "lb", "service") for k, v in st.get(part, {}).items()},
            **{f"dataplane.{k}": v for k, v in st.get("dataplane", {}).items()},
            **{f"{part}.{k}": v for part in ("dataplane_held", "dataplane_crossed", "nat_crossed", "lb_crossed")
               for k, v in st.get(part, {}).items()}}
    for k, v in sorted(rows.items()):
        t.add_row(k, str(v))
    console.print(t)
    for line in st.get("lines", []):
        console.print(line_table(line))
    if served := st.get("endpoints_served"):
        console.print(endpoints_table(served))


def endpoints_table(served: list[dict]) -> Table:
    """The service endpoints an instance serves: where each leads, from which source, its connections now."""
    t = Table(title="service endpoints served", header_style="bold cyan")
    for c in ("endpoint", "VNI", "address", "source", "service", "ports", "PROXY v2", "connections"):
        t.add_column(c, overflow="fold")
    for e in served:
        t.add_row(e["id"], str(e["vni"]), e["ip"], e["source"], ", ".join(e["addresses"]), ", ".join(e["ports"]),
                  "yes" if e["proxy_protocol"] else "no", str(e["connections"]))
    return t


def line_table(line: dict) -> Table:
    """A private line as its instance carries it: its sessions and what each learned."""
    t = Table(title=f"private line {line['id']}: VLAN {line['vlan']} <-> VNI {line['vni']}, {line['routes']} "
                    f"routes (static: {', '.join(line['static_routes']) or 'none'})", header_style="bold cyan")
    for c in ("session", "BGP", "BFD", "received", "accepted", "advertised", "learned", "last error"):
        t.add_column(c, overflow="fold")
    for s in line["sessions"]:
        learned = s.get("learned", [])
        t.add_row(f"{s['local_ip']} -> {s['customer_ip']}", s.get("bgp_state", "Idle"), s.get("bfd_state", "down"),
                  str(s.get("received", 0)), str(s.get("accepted", 0)), str(s.get("advertised", 0)),
                  ", ".join(learned[:8]) + (f" (+{len(learned) - 8})" if len(learned) > 8 else ""),
                  s.get("last_error") or "")
    return t
