"""The demo's real guests: a KVM guest (its own Linux kernel, its address by its own DHCP client from the switch)
and a podman container (through tianji-cni) in acme's VPC, beside the namespace VMs."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from topologies.cluster import DEFAULT_STATE, TIANJI, Cluster
from topologies.cluster_state import State
from topologies.containers import container_add, network_add

console = Console(width=None if sys.stdout.isatty() else 150, emoji=False)  # ":100:" in an IPv6 address is not an emoji


def real_guests(c: Cluster, env: dict, orchestrator_env: dict, subnet: dict, vms: dict, results: Table,
                step: Callable[[str], None]) -> int:
    step("4f. real guests in acme's VPC: a KVM guest (its own kernel; TCG where KVM does not boot it) on hv1, "
         "a podman container through tianji-cni on hv3")
    failures = 0
    port = json.loads(subprocess.run([TIANJI, "--json", "port", "create", "guest1", "--subnet", subnet["id"], "--ip",
                                      "10.0.1.20"], env=env, capture_output=True, text=True, check=True).stdout)
    subprocess.run([TIANJI, "port", "bind", port["id"], "hv1"], env=orchestrator_env, capture_output=True, check=True)
    cmd = [TIANJI, "cluster", "vm", "add", "--cluster", c.state.name, "--state-dir", str(DEFAULT_STATE), "--port",
           port["id"], "--name", "guest1", "--kind", "kvm"]
    console.print(f"[dim]$ tianji {' '.join(cmd[1:])}[/dim]")
    r = subprocess.run(cmd, capture_output=True, text=True)
    console.print(r.stdout.rstrip() or r.stderr.strip())
    c.state = State.load(Path(c.state.dir))  # the CLI's process recorded the guest
    guest = c.state.vms.get("guest1")
    good = guest is not None and guest.get("dhcp_ip") == port["ip"]
    failures += not good
    results.add_row("KVM guest: its own DHCP client", "guest1 (hv1)", "the switch", port["ip"],
                    "[green]ok" if good else f"[red]FAIL ({r.stderr.strip()[-120:]})", "-", "-")
    if guest is None:
        return failures + 2
    net = network_add(c, "acme-web", subnet["id"], "hv3")
    console.print(f"[dim]$ podman run -d --network {net} localhost/tianji-busybox sleep 1d[/dim]  "
                  f"(CONTAINERS_CONF=/etc/tianji/containers.conf)")
    box = container_add(c, net, "box1", "hv3")
    console.print(f"  container box1 on hv3: {box['ip']} (its port made and bound by tianji-cni)")
    vms["acme/guest1"], vms["acme/box1"] = guest, box
    for what, src, dst in (("KVM guest -> VM on hv2", "guest1", vms["acme/web2"]),
                           ("container -> KVM guest", "box1", guest)):
        r = c.vm_exec(src, "ping", "-c", "3", "-W", "1", dst["ip"], timeout=30)
        avg = next((ln.split("/")[4].split()[0] for ln in r.stdout.splitlines() if "min/avg" in ln), "-")
        good = r.returncode == 0
        failures += not good
        results.add_row(what, src, f"{dst['name']} {dst['ip']}", "reach", "[green]ok" if good else "[red]FAIL",
                        f"{avg} ms", "-")
    return failures
