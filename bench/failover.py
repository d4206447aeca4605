"""NAT gateway failover: how long a VM's traffic through a killed instance is lost, and whether a loaded system
fails over when nothing failed.

    python bench/failover.py [--reps 5] [--load-seconds 20]

On the emulated `small` cluster (two NAT instances): a VM pings the external host every 10 ms through its NAT
gateway; the instance homing the gateway's EIP is killed (SIGKILL); the loss is the time between the last reply
before and the first after. Measured twice in one run: with the earlier detection settings (heartbeats every
0.5 s, down after 1.5 s: the baseline) and with the current ones (0.1 s, down after 0.5 s), and the ratio printed.
Then, with the current settings, a load phase (64-byte UDP at full rate through the gateway, and a burst of API
writes) must mark no instance down.

What bounds the loss: the silence the controller waits for (TIANJI_GATEWAY_DOWN_AFTER), plus at most one
liveness tick (a quarter of it), plus the propagation: the topology stamp wakes the agents' and the surviving
instance's watches, the vSwitches send the VPC's buckets to the survivor, which homes the EIP and announces it.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gateway import nat_vm

SETTINGS = {"baseline (beat 0.5 s, down after 1.5 s)": ("0.5", "1.5"),
            "now (beat 0.1 s, down after 0.5 s)": ("0.1", "0.5")}


def home_of(c, eip: str) -> str | None:
    return next((g for g in ("gw1", "gw2") if eip in c.gateway_status(g).get("eips", [])), None)


def loss_ms(c, vm: dict, eip: str, inet: str) -> float:
    """Kill the instance homing `eip` under a 10 ms ping; the longest gap between replies, in ms."""
    ping = subprocess.Popen(["ip", "netns", "exec", vm["ns"], "ping", "-D", "-i", "0.01", "-W", "1", "-w", "6",
                             inet], stdout=subprocess.PIPE, text=True)
    time.sleep(1.5)
    victim = home_of(c, eip)
    c.kill_gateway(victim)
    out, _ = ping.communicate(timeout=30)
    c.start_gateway(victim)
    c.wait_gateways(timeout=30)
    stamps = [float(m) for m in re.findall(r"^\[(\d+\.\d+)\].*bytes from", out, re.M)]
    return max(b - a for a, b in zip(stamps, stamps[1:], strict=False)) * 1000 - 10


def downs(c) -> int:
    log = (Path(c.state.dir) / "controller.log").read_text(errors="replace")
    return log.count("marked down")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--load-seconds", type=int, default=20)
    args = ap.parse_args()
    from topologies.cluster import Cluster

    results: dict[str, list[float]] = {}
    spurious = None
    for k, (label, (beat, down)) in enumerate(SETTINGS.items()):
        os.environ["TIANJI_GATEWAY_BEAT"], os.environ["TIANJI_GATEWAY_DOWN_AFTER"] = beat, down
        c = Cluster.up("small", name=f"bf{k}", progress=lambda m: None)
        try:
            vm, eip = nat_vm(c, "fo", "fo")
            inet = c.state.nodes["inet"]["ip"]
            c.wait_converged()
            deadline = time.time() + 20
            while c.vm_exec("fo", "ping", "-c", "1", "-W", "1", inet).returncode and time.time() < deadline:
                pass
            results[label] = []
            for i in range(args.reps):
                results[label].append(loss_ms(c, vm, eip, inet))
                print(f"  {label}: rep {i + 1}: {results[label][-1]:.0f} ms", flush=True)
            if label.startswith("now"):
                before = downs(c)
                ns = c.state.nodes["inet"]["ns"]
                srv = subprocess.Popen(["ip", "netns", "exec", ns, "iperf3", "-s", "-1", "-p", "5298"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(0.4)
                writes = threading.Thread(target=lambda adm=c.admin: [adm.post("/v1/tenants", {"name": f"load{j}"})
                                                                      for j in range(300)])
                writes.start()
                c.vm_exec("fo", "iperf3", "-c", inet, "-p", "5298", "-u", "-b", "0", "-l", "18", "-P", "4", "-t",
                          str(args.load_seconds), timeout=args.load_seconds + 30)
                writes.join()
                srv.kill()
                spurious = downs(c) - before
        finally:
            c.down()
    base, now = (statistics.median(v) for v in results.values())
    print(f"failover loss under a 10 ms ping (median of {args.reps}): baseline {base:.0f} ms, now {now:.0f} ms "
          f"(x{now / base:.2f}); instances marked down under load with nothing failed: {spurious}")


if __name__ == "__main__":
    main()
