"""QEMU live migration of a running KVM guest from hv1 to hv2 (the migration stream over the management network;
a disk-less guest), with the port's binding following it: `migrating_to` first (the destination's switch gets the
port's flows, every switch sends its traffic to both hosts), `host` once the guest runs there.

A namespace VM on hv3 pings the guest every 10 ms and holds a TCP connection to it throughout: the ping loses
under 100 ms, the connection survives, no flow of the port is left on hv1, and the guest's address, MAC and
security groups are what they were.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

from tests.scenarios.conftest import ex, reach, wait_for
from topologies.cluster_guests import kvm_migrate

# a TCP connection held open: one line out and its echo back every 50 ms; prints how many round trips worked and
# the longest wait for one
HOLD = r"""
import socket, sys, time
s = socket.create_connection((sys.argv[1], 7000), timeout=5)
s.settimeout(10)
ok, worst, end = 0, 0.0, time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    t = time.monotonic()
    s.sendall(b"x" * 20 + b"\n")
    got = b""
    while not got.endswith(b"\n"):
        chunk = s.recv(100)
        if not chunk:
            print("CLOSED", ok, worst); sys.exit(1)
        got += chunk
    ok += 1
    worst = max(worst, time.monotonic() - t)
    time.sleep(0.05)
print("OK", ok, round(worst * 1000))
"""
# the guest's echo server on 7000 (busybox nc -ll runs `cat` for each connection, and listens on)
ECHO = "nc -ll -p 7000 -e cat >/dev/null 2>&1 &"


def lost_ms(ping_out: str, interval_ms: float = 10) -> float:
    """The time without answers: the longest run of missing sequence numbers, times the interval."""
    seqs = sorted({int(m) for m in re.findall(r"icmp_seq=(\d+)", ping_out)})
    if not seqs:
        return float("inf")
    gaps = [b - a - 1 for a, b in zip(seqs, seqs[1:], strict=False)]
    return max(gaps, default=0) * interval_ms


def test_live_migration_keeps_ping_and_tcp_and_leaves_nothing_behind(cluster, tenants) -> None:
    n = tenants()
    vpc = n.vpc("prod", "10.71.0.0/16", {"s": "10.71.1.0/24"})
    sg = vpc["default_security_group_id"]
    n.client.post(f"/v1/security-groups/{sg}/rules", {"direction": "ingress", "protocol": "tcp",
                                                      "port_range_min": 7000, "port_range_max": 7000,
                                                      "remote_cidr": "10.71.0.0/16"})
    guest = n.vm("s", "hv1", kind="kvm")
    vm = n.vm("s", "hv3", dhcp=True)
    before = cluster.admin.get(f"/v1/ports/{guest['port']['id']}")
    assert reach(cluster, vm, guest["ip"], timeout=10)
    assert ex(cluster, guest, "sh", "-c", ECHO).returncode == 0
    held = subprocess.Popen(["ip", "netns", "exec", vm["ns"], sys.executable, "-c", HOLD, guest["ip"], "25"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ping = subprocess.Popen(["ip", "netns", "exec", vm["ns"], "ping", "-i", "0.01", "-W", "1", "-w", "22",
                             guest["ip"]], stdout=subprocess.PIPE, text=True)
    time.sleep(2)
    figures = kvm_migrate(cluster, guest["name"], "hv2")
    out, _ = ping.communicate(timeout=60)
    tcp, err = held.communicate(timeout=60)
    lost = lost_ms(out)
    print(f"migration: {figures}; ping lost {lost} ms; TCP {tcp.strip()}")
    assert lost < 100, f"the 10 ms ping lost {lost} ms ({figures})"
    assert tcp.startswith("OK"), (tcp, err)

    after = cluster.admin.get(f"/v1/ports/{guest['port']['id']}")
    assert after["host"] == "hv2" and after["migrating_to"] is None
    assert (after["ip"], after["mac"], after["security_group_ids"]) == \
        (before["ip"], before["mac"], before["security_group_ids"])
    assert guest["ip"] in ex(cluster, guest, "ip", "-o", "-4", "addr", "show", "eth0").stdout
    assert guest["port"]["mac"] in ex(cluster, guest, "ip", "-o", "link", "show", "eth0").stdout
    hv1 = cluster.hypervisor("hv1")
    wait_for(lambda: guest["port"]["mac"] not in hv1.ofctl("dump-flows", "br-int")
             and f"nw_dst={guest['ip']}" not in hv1.ofctl("dump-flows", "br-int"), 10,
             "every flow of the port gone from hv1")
    assert guest["port"]["mac"] not in hv1.vsctl("--columns=external_ids", "list", "Interface")
    wait_for(lambda: cluster.admin.get(f"/v1/ports/{guest['port']['id']}")["status"] == "UP", 10,
             "hv2 reporting the port UP")
    assert reach(cluster, vm, guest["ip"], timeout=5)
