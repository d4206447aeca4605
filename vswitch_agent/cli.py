"""`tianji agent`: run the vSwitch agent, or print its status."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

agent_app = typer.Typer(help="The vSwitch agent (one per hypervisor).", invoke_without_command=True)
console = Console(width=None if sys.stdout.isatty() else 160, emoji=False)  # ":100:" in an IPv6 address is not an emoji
DEFAULT_STATE = Path("/run/tianji")


@agent_app.callback()
def agent(ctx: typer.Context,
          host: str = typer.Option(None, help="this hypervisor's name"),
          controller: str = typer.Option(None, envvar="TIANJI_URL",
                                         help="controller URL, or several replicas' URL,URL,... (tried in turn)"),
          token: str = typer.Option(None, envvar="TIANJI_TOKEN", help="admin or host token"),
          ca: str = typer.Option(None, envvar="TIANJI_CA", help="verify the controller against this CA (PEM; "
                                                                "default: the system's store)"),
          cert: str = typer.Option(None, envvar="TIANJI_CERT", help="this host's certificate (mutual TLS)"),
          key: str = typer.Option(None, envvar="TIANJI_KEY", help="its private key"),
          vtep_ip: str = typer.Option(None, help="VTEP address (IP/prefix), placed on br-phy"),
          underlay_if: str = typer.Option(None, help="underlay NIC, added to br-phy"),
          ovs_rundir: str = typer.Option(None, help="private OVS run directory (default: the system OVS)"),
          datapath: str = typer.Option("netdev", help="netdev (userspace) or system"),
          of_port: int = typer.Option(6653, help="local OpenFlow listen port"),
          port_type: str = typer.Option("auto", help="underlay NIC's OVS port: auto (AF_XDP if it works), afxdp, "
                                                     "system"),
          state_dir: Path = typer.Option(DEFAULT_STATE, help="status and zone files"),
          dns_forwarder: str = typer.Option(None, help="the operator's resolver (IP[:PORT]) for VMs' names outside "
                                                       "the VPCs' zone (default: those are refused)"),
          metrics_port: int = typer.Option(None, help="serve Prometheus metrics on this TCP port"),
          metrics_address: str = typer.Option("127.0.0.1", help="... on this address"),
          log_level: str = typer.Option("info"),
          log_format: str = typer.Option("text", envvar="TIANJI_LOG_FORMAT", help="text or json")) -> None:
    """Run the agent: `tianji agent --host NAME --controller URL --token T --vtep-ip IP --underlay-if IF`."""
    if ctx.invoked_subcommand is not None:
        return
    missing = [n for n, v in (("--host", host), ("--controller", controller), ("--token", token),
                              ("--vtep-ip", vtep_ip), ("--underlay-if", underlay_if)) if not v]
    if missing:
        console.print(f"[red]error:[/red] missing {', '.join(missing)}")
        raise typer.Exit(2)
    if port_type not in ("auto", "afxdp", "system"):
        console.print("[red]error:[/red] --port-type must be auto, afxdp or system")
        raise typer.Exit(2)
    if datapath not in ("netdev", "system"):
        console.print("[red]error:[/red] --datapath must be netdev or system")
        raise typer.Exit(2)
    from vswitch_agent.dns_forward import parse_server

    try:
        forwarder = parse_server(dns_forwarder) if dns_forwarder else None
    except (OSError, ValueError) as e:
        console.print(f"[red]error:[/red] --dns-forwarder {dns_forwarder!r}: give IP or IP:PORT ({e})")
        raise typer.Exit(2) from None
    from tianji import logs

    try:
        logs.setup(log_level, log_format, component=host)
    except ValueError as e:
        console.print(f"[red]error:[/red] --log-format: {e}")
        raise typer.Exit(2) from None
    from tianji.tls import ClientTls
    from vswitch_agent.agent import run
    from vswitch_agent.host import AgentOptions

    run(AgentOptions(host=host, controller=controller, token=token, vtep_ip=vtep_ip, underlay_if=underlay_if,
                     tls=ClientTls.from_env(ca, cert, key),
                     ovs_rundir=ovs_rundir, datapath=datapath, of_port=of_port, port_type=port_type,
                     state_dir=state_dir, dns_forwarder=forwarder, metrics_port=metrics_port,
                     metrics_address=metrics_address))


@agent_app.command("status")
def status(host: str = typer.Option(None, help="agent host name (default: every agent in --state-dir)"),
           state_dir: Path = typer.Option(DEFAULT_STATE), as_json: bool = typer.Option(False, "--json")) -> None:
    """Revision applied, flow counts, drops per table and the last error of local agents."""
    files = [state_dir / f"agent-{host}.json"] if host else sorted(state_dir.glob("agent-*.json"))
    rows = []
    for f in files:
        try:
            rows.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            console.print(f"[red]error:[/red] no status at {f}: is the agent running with --state-dir {state_dir}?")
            raise typer.Exit(1) from None
    if as_json:
        console.print_json(json.dumps(rows))
        return
    t = Table(title="tianji agents", header_style="bold cyan")
    for c in ("host", "controller", "revision", "desired", "switch", "flows", "adds/dels", "ports up", "port types",
              "drops by table", "last error", "age"):
        t.add_column(c, overflow="fold")
    for r in rows:
        up = sum(1 for v in r.get("ports", {}).values() if v == "UP")
        err = r.get("last_error") or {}
        t.add_row(r["host"], f"{r.get('controller', '')} ({r.get('controller_failovers', 0)} moves)",
                  str(r.get("revision")), str(r.get("desired_revision")),
                  ("synced" if r.get("switch_synced") else "reading back") if r.get("switch_connected")
                  else "DISCONNECTED", str(r.get("flows")),
                  f"{r.get('flow_adds')}/{r.get('flow_deletes')}", f"{up}/{len(r.get('ports', {}))}",
                  port_types(r.get("port_types", {})),
                  " ".join(f"{k}:{v}" for k, v in sorted(r.get("drops", {}).items(), key=lambda x: int(x[0])) if v),
                  err.get("message", ""), f"{time.time() - r.get('updated', 0):.0f}s")
    console.print(t)


@agent_app.command("pipeline")
def pipeline() -> None:
    """Print the br-int OpenFlow pipeline."""
    from vswitch_agent.pipeline import describe

    console.print(describe())


def port_types(t: dict) -> str:
    """`underlay afxdp-nonpmd, VMs 3 afxdp-nonpmd 1 system`: the OVS port types in use (AF_XDP is the fast one)."""
    vifs = " ".join(f"{n} {k}" for k, n in sorted(t.get("vifs", {}).items()))
    return f"underlay {t.get('underlay') or '?'}" + (f", VMs {vifs}" if vifs else "")
