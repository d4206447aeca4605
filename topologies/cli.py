"""`tianji cluster`: the emulated cluster on Mininet."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from topologies.cluster import DEFAULT_STATE, Cluster
from topologies.cluster_state import State

cluster_app = typer.Typer(no_args_is_help=True, help="Emulated cluster: hypervisors with OVS + agent, VMs.")
console = Console(width=None if sys.stdout.isatty() else 160, emoji=False)  # ":100:" in an IPv6 address is not an emoji


@cluster_app.command("up")
def up(topology: str = typer.Option("small", help="small, medium, or a path to a topology JSON file"),
       cli: bool = typer.Option(False, "--cli", help="drop into the Mininet CLI (the cluster stays up after)"),
       name: str = typer.Option("tj", help="cluster name (prefix of every namespace and link it makes)"),
       state_dir: Path = typer.Option(DEFAULT_STATE),
       database_url: str = typer.Option(None, envvar="TIANJI_DATABASE_URL"),
       controllers: int = typer.Option(None, help="controller replicas (default: the topology's, else 1); more "
                                                  "than one needs --database-url (PostgreSQL)")) -> None:
    """Start the controller(s), the hypervisors (OVS + agent each) and the other nodes; wait for every agent."""
    c = Cluster.up(topology, name=name, state_dir=state_dir, database_url=database_url, controllers=controllers,
                   progress=lambda m: console.print(f"[cyan]>[/cyan] {m}"))
    _print_status(c)
    console.print(f"export TIANJI_URL={c.state.controller_url} TIANJI_TOKEN={c.state.admin_token} "
                  f"TIANJI_CA={c.state.ca}")
    if cli:
        from mininet.cli import CLI

        CLI(c.net)


@cluster_app.command("down")
def down(name: str = typer.Option("tj"), state_dir: Path = typer.Option(DEFAULT_STATE)) -> None:
    """Remove exactly what `up` created (also after a crash)."""
    st = State.load(state_dir / name)
    Cluster(st).down()
    console.print(f"cluster {name!r} removed: {len(st.netns)} namespaces, {len(st.links)} links, "
                  f"{len(st.pids)} processes")


vm_app = typer.Typer(no_args_is_help=True, help="VMs of the emulated cluster.")
cluster_app.add_typer(vm_app, name="vm")


@vm_app.command("add")
def vm_add(port: str = typer.Option(..., "--port", help="the port id; the VM is plugged on its host"),
           vm_name: str = typer.Option(None, "--name"), static: bool = typer.Option(False, help="no DHCP"),
           kind: str = typer.Option("netns", "--kind", help="netns (a namespace: quick) or kvm (a QEMU guest with "
                                                            "its own kernel, on a tap plugged by iface-id)"),
           nic: str = typer.Option("tap", "--nic", help="a kvm guest's NIC: tap, or vhost-user (on a host running "
                                                        "OVS-DPDK: `tianji cluster hv dpdk HOST`)"),
           name: str = typer.Option("tj", "--cluster"), state_dir: Path = typer.Option(DEFAULT_STATE)) -> None:
    """Plug a VM into a port on the port's host: a namespace, or a real KVM guest (`--kind kvm`)."""
    if kind not in ("netns", "kvm"):
        raise typer.BadParameter("netns or kvm", param_hint="--kind")
    if nic not in ("tap", "vhost-user") or (nic != "tap" and kind != "kvm"):
        raise typer.BadParameter("tap or vhost-user, and only with --kind kvm", param_hint="--nic")
    info = Cluster(State.load(state_dir / name)).vm_add(port, vm_name, dhcp=not static, kind=kind, nic=nic,
                                                        progress=lambda m: console.print(f"[cyan]>[/cyan] {m}"))
    if kind == "kvm":
        console.print(f"KVM guest {info['name']} on {info['host']} ({info['accel'].upper()}): its DHCP client bound "
                      f"{info['dhcp_ip']} ({nic} {info['tap']}; `tianji cluster vm exec {info['name']} -- ip addr`)")
        return
    console.print(f"VM {info['name']} plugged on {info['host']}: {info['ip']}/{info['prefixlen']} "
                  f"(namespace {info['ns']}; `ip netns exec {info['ns']} ping ...`)")


@vm_app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def vm_exec(ctx: typer.Context, vm_name: str, name: str = typer.Option("tj", "--cluster"),
            state_dir: Path = typer.Option(DEFAULT_STATE)) -> None:
    """Run a command in a VM: in its namespace, or on a KVM guest's serial console. Its output and exit status."""
    r = Cluster(State.load(state_dir / name)).vm_exec(vm_name, *ctx.args, timeout=120)
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    raise typer.Exit(r.returncode)


@vm_app.command("remove")
def vm_remove(vm_name: str, name: str = typer.Option("tj", "--cluster"),
              state_dir: Path = typer.Option(DEFAULT_STATE)) -> None:
    """Unplug a VM and remove its namespace."""
    Cluster(State.load(state_dir / name)).vm_remove(vm_name)
    console.print(f"VM {vm_name} removed")


hv_app = typer.Typer(no_args_is_help=True, help="Hypervisors of the emulated cluster.")
cluster_app.add_typer(hv_app, name="hv")


@hv_app.command("dpdk")
def hv_dpdk(host: str, off: bool = typer.Option(False, "--off", help="back to the plain userspace datapath"),
            name: str = typer.Option("tj", "--cluster"), state_dir: Path = typer.Option(DEFAULT_STATE)) -> None:
    """Run HOST's Open vSwitch on DPDK (for vhost-user guests), or back without it (`--off`)."""
    from topologies import dpdk_host

    c = Cluster(State.load(state_dir / name))
    if host not in c.state.hypervisors:
        raise typer.BadParameter(f"no hypervisor {host!r} in cluster {name!r}", param_hint="HOST")
    (dpdk_host.disable if off else dpdk_host.enable)(c, host, progress=lambda m: console.print(f"[cyan]>[/cyan] {m}"))


@cluster_app.command("status")
def status(name: str = typer.Option("tj"), state_dir: Path = typer.Option(DEFAULT_STATE)) -> None:
    """The cluster's nodes, their namespaces and addresses, and each agent's state."""
    _print_status(Cluster(State.load(state_dir / name)))


def _print_status(c: Cluster) -> None:
    st = c.state
    t = Table(title=f"cluster {st.name} ({st.topology.get('name')}, up in {st.up_seconds} s)",
              header_style="bold cyan")
    for col in ("node", "role", "namespace", "address", "agent"):
        t.add_column(col)
    for n, h in st.hypervisors.items():
        a = c.agent_status(n)
        t.add_row(n, "hypervisor (OVS-DPDK)" if h.get("datapath") == "dpdk" else "hypervisor", h["ns"], h["vtep"],
                  f"rev {a.get('revision')} flows {a.get('flows')}" if a else "no status")
    for n, info in st.nodes.items():
        t.add_row(n, info["role"], info["ns"], info.get("underlay_ip") or info.get("ip") or "", "")
    for n, v in st.vms.items():
        kind = f"kvm guest ({v.get('accel', '').upper()}, {v.get('nic', 'tap')})" if v.get("kind") == "kvm" else "vm"
        t.add_row(n, f"{kind} on {v['host']}", v["ns"], f"{v['ip']}/{v.get('prefixlen', '')}", "")
    console.print(t)
