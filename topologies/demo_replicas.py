"""The demo's replica step: kill -9 the controller replica that leads and that every host watches, under a ping."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from topologies import netns
from topologies.cluster import Cluster

console = Console(width=None if sys.stdout.isatty() else 150, emoji=False)  # ":100:" in an IPv6 address is not an emoji


def replica_failover(c: Cluster, vms: dict, results: Table, step: Callable[[str], None]) -> int:
    """The leader is killed under a ping between two hypervisors; every host moves to the other replica, which
    leads; the peering deleted after this goes through it. The killed one comes back as a follower. (With one
    controller, on SQLite, there is nothing to fail over to.)"""
    if len(c.state.controllers) < 2:
        return 0
    step("4d. kill -9 the controller replica that leads and that every host watches, under a 10 ms ping")
    lead = c.leader()
    if lead is None:
        results.add_row("controller replica killed", "-", "-", "another leads", "[red]FAIL (no leader)", "-", "-")
        return 1
    other = 1 - lead
    src, dst = vms["acme/web1"], vms["acme/web2"]
    ping = netns.popen("ping", "-q", "-i", "0.01", "-W", "1", "-c", "300", dst["ip"], ns=src["ns"],
                       stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    t0 = time.monotonic()
    c.kill_controller(lead)
    moved = None
    while time.monotonic() - t0 < 10:
        if set(c.watching().values()) == {other}:
            moved = time.monotonic() - t0
            break
        time.sleep(0.02)
    while time.monotonic() - t0 < 10 and not (c.replica_health(other) or {}).get("liveness_checks"):
        time.sleep(0.05)
    led = time.monotonic() - t0
    out, _ = ping.communicate(timeout=30)
    sent, _, rest = out.partition(" packets transmitted, ")
    received = rest.split(" received")[0]
    lost = int(sent.split()[-1]) - int(received) if received.isdigit() else -1
    c.start_controller(lead)
    back = None
    while time.monotonic() - t0 < 40 and back is None:
        back = (c.replica_health(lead, "/readyz") or {}).get("role")
        time.sleep(0.1)
    good = moved is not None and lost == 0 and led < 10 and back == "follower"
    results.add_row("controller replica killed (kill -9)", "every host", f"replica {other}",
                    "hosts move, no loss", "[green]ok" if good else "[red]FAIL",
                    f"moved {moved:.2f} s, leads {led:.2f} s" if moved else "-", f"{lost} of {sent.split()[-1]} lost")
    console.print(f"[cyan]>[/cyan] every agent and gateway on replica {other} after "
                  f"{moved if moved is None else round(moved, 2)} s; it runs the liveness checks after {led:.2f} s; "
                  f"ping web1 -> web2 lost {lost}; replica {lead} is back as a {back}")
    return 0 if good else 1
