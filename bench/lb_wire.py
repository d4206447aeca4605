"""The load balancer on the wire, against the Linux kernel doing the same job in the same run.

Three namespaces: the client `c` (the traffic generator, bench/native/lbgen.c, and for tianji also the members'
host), the balancer `l`, and the backends' side `s`. c.ul0 -- l.ul0 is the underlay, l.ext0 -- s.eth0 the
backends' link.

  kernel  l DNATs VIP:port with nftables through a 65,537-slot Maglev map, with conntrack:
          `dnat to jhash ip saddr . tcp sport mod 65537 seed S map @lut` (the same Maglev table tianji builds).
          Two jobs: the instance's own (a kernel VXLAN device takes the client's packets from the overlay and
          sends the DNATed ones on to the members' host, c, which counts them), and a lighter one, plain IP in and
          routed to the backends' link (s counts)
  tianji  a `tianji gateway run --role lb` instance in l (native fast path) gets the client's packets in VXLAN and
          sends them on, re-encapsulated, to the members' host (c, which counts what arrives from the instance)

Both see 64-byte inner packets from the same generator: `flows` (1,000 established flows, UDP) and `new` (every
SYN a new 5-tuple: a new connection's decision, conntrack entry or connection-table entry). The generator runs on
the first core; the kernel's RPS and the instance's loop get the other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.native_tools import compiled
from nfv_gateways.roles.lb.maglev import member_key
from nfv_gateways.roles.lb.native import NativeMaglev
from topologies import netns
from topologies.gwlab import TIANJI, stop
from topologies.machines import GatewayHost
from topologies.netns import sh

C, L, S = "tjlbc", "tjlbl", "tjlbs"
DIR = Path("/run/tianji-lab/tjlb")
CLIENT_VTEP, LB_VTEP = "10.77.0.1", "10.77.0.2"
VIP, CLIENT_IP, VNI, ROUTER_MAC = "10.79.0.100", "10.80.0.1", 1001, "0a:58:00:00:00:01"
BACKENDS = [f"10.78.0.{10 + i}" for i in range(8)]
M, SEED = 65537, 0x5EED


def ns(n: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return sh("ip", "netns", "exec", n, *cmd, check=check)


def mac(n: str, dev: str) -> str:
    return json.loads(sh("ip", "-n", n, "-j", "link", "show", "dev", dev).stdout)[0]["address"]


def generator() -> Path:
    return compiled("lbgen")


class Lab:
    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def plumb(self) -> None:
        self.down()
        DIR.mkdir(parents=True, exist_ok=True)
        for n in (C, L, S):
            netns.add(n)
        netns.veth("ul0", C, "ul0", L, full_checksums=True)
        netns.veth("ext0", L, "eth0", S, full_checksums=True)
        for n, dev, addr in ((C, "ul0", f"{CLIENT_VTEP}/24"), (L, "ul0", f"{LB_VTEP}/24"),
                             (S, "eth0", "10.78.0.1/24")):
            netns.address(n, dev, addr)

    def count_rule(self, n: str, dev: str, match: str) -> None:
        """Count (and drop, so nothing answers) what arrives on `dev` matching `match`."""
        for c in ("add table netdev bench", f"add chain netdev bench in {{ type filter hook ingress device {dev} "
                  "priority 0 ; }", f"add rule netdev bench in {match} counter drop"):
            ns(n, "nft", c)
        self.counted = n

    def counted_packets(self) -> int:
        out = ns(self.counted, "nft", "list", "chain", "netdev", "bench", "in").stdout
        return int(out.split("counter packets ")[1].split()[0])

    # --- the two balancers -------------------------------------------------------------------------------------
    def kernel(self, overlay: bool) -> None:
        """`overlay`: the same job as the instance's (VXLAN in from the client's host, DNAT, VXLAN out to the
        members' host, counted there); else plain IP in, DNAT, routed to the backends' link (a lighter job)."""
        self.plumb()
        ns(L, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        ns(L, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0")
        if overlay:
            sh("ip", "-n", L, "link", "add", "vx0", "address", ROUTER_MAC, "type", "vxlan", "id", str(VNI), "local",
               LB_VTEP, "remote", CLIENT_VTEP, "dstport", "4789", "nolearning")
            sh("ip", "-n", L, "addr", "add", "10.78.0.2/24", "dev", "vx0")
            sh("ip", "-n", L, "link", "set", "vx0", "up")
            for i, b in enumerate(BACKENDS):  # the members, behind the client's VTEP (their host), as for tianji
                sh("ip", "-n", L, "neigh", "replace", b, "lladdr", f"02:00:00:00:01:{i:02x}", "dev", "vx0", "nud",
                   "permanent")
            self.count_rule(C, "ul0", f"ip saddr {LB_VTEP} udp dport 4789")
        else:
            sh("ip", "-n", L, "addr", "add", "10.78.0.2/24", "dev", "ext0")
            sh("ip", "-n", L, "route", "add", "10.80.0.0/16", "via", CLIENT_VTEP)
            for b in BACKENDS:
                sh("ip", "-n", S, "addr", "add", f"{b}/24", "dev", "eth0")
            self.count_rule(S, "eth0", "ip daddr 10.78.0.0/24")
        self.rps()
        table = NativeMaglev().build([member_key(b) for b in BACKENDS], [1] * len(BACKENDS), M)
        elements = ", ".join(f"{i} : {BACKENDS[x]}" for i, x in enumerate(table))
        rules = DIR / "lb.nft"
        rules.write_text(f"""table ip lb {{
  map lut {{ typeof numgen inc mod {M} : ip daddr ; elements = {{ {elements} }} }}
  chain pre {{ type nat hook prerouting priority dstnat ;
    ip daddr {VIP} tcp dport 80 dnat to jhash ip saddr . tcp sport mod {M} seed {SEED:#x} map @lut
    ip daddr {VIP} udp dport 80 dnat to jhash ip saddr . udp sport mod {M} seed {SEED:#x} map @lut
  }}
}}
""")
        ns(L, "nft", "-f", str(rules))
        self.frame_dst, self.ipoff = mac(L, "ul0"), 64 if overlay else 14

    def tianji(self, fastpath: str) -> str:
        self.plumb()
        members = [{"id": f"m{i}", "ip": b, "weight": 1} for i, b in enumerate(BACKENDS)]
        cfg = {"name": "lab", "revision": 1, "vtep_ip": LB_VTEP,
               "vpcs": [{"id": "v1", "vni": VNI, "router_mac": ROUTER_MAC}],
               "endpoints": [{"port_id": f"p{i}", "vpc_id": "v1", "vni": VNI, "ip": b,
                              "mac": f"02:00:00:00:01:{i:02x}", "host": "c", "vtep_ip": CLIENT_VTEP}
                             for i, b in enumerate(BACKENDS)],
               "vteps": [{"host": "c", "ip": CLIENT_VTEP}],
               "lbs": [{"id": "lb1", "vni": VNI, "vip": VIP, "listeners": [
                   {"protocol": p, "port": 80, "idle_timeout_s": 60, "members": members} for p in ("tcp", "udp")]}]}
        (DIR / "config.json").write_text(json.dumps(cfg))
        host = GatewayHost("lab", L, f"{LB_VTEP}/24", "lb")
        cmd = ["ip", "netns", "exec", L, *host.command(TIANJI, ["--config-file", str(DIR / "config.json")], DIR,
                                                        "--fastpath", fastpath)]
        with open(DIR / "gateway.log", "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                st = json.loads((DIR / "gateway-lab.json").read_text())
                if st.get("revision") == 1:
                    break
            except (OSError, ValueError):
                pass
            if self.proc.poll() is not None or time.time() > deadline - 1:
                raise RuntimeError(f"the lab instance did not start: {(DIR / 'gateway.log').read_text()[-1500:]}")
            time.sleep(0.2)
        self.count_rule(C, "ul0", f"ip saddr {LB_VTEP} udp dport 4789")
        self.frame_dst, self.ipoff = mac(L, "ul0"), 64
        return st["fastpath"].split()[0]

    def rps(self) -> None:
        """The kernel's forwarding on the second core, by RPS (otherwise it runs in the generator's softirq, on the
        generator's core). Not for the instance: its loop has that core already, and RPS would put its receive
        processing there too (measured: 0.3x of it without)."""
        cpu = max(os.sched_getaffinity(0))
        ns(L, "sh", "-c", f"echo {1 << cpu:x} > /sys/class/net/ul0/queues/rx-0/rps_cpus")

    # --- traffic -----------------------------------------------------------------------------------------------
    def template(self, proto: str) -> Path:
        from scapy.layers.inet import IP, TCP, UDP
        from scapy.layers.l2 import Ether

        l4 = TCP(sport=10000, dport=80, flags="S") if proto == "tcp" else UDP(sport=10000, dport=80) / (b"\0" * 18)
        inner = IP(src=CLIENT_IP, dst=VIP) / l4
        src = mac(C, "ul0")
        if self.ipoff == 14:
            frame = Ether(src=src, dst=self.frame_dst) / inner
        else:
            vx = b"\x08\0\0\0" + VNI.to_bytes(3, "big") + b"\0"
            frame = (Ether(src=src, dst=self.frame_dst) / IP(src=CLIENT_VTEP, dst=LB_VTEP)
                     / UDP(sport=49152, dport=4789, chksum=0) / (vx + bytes(Ether(src="02:00:00:00:00:aa",
                                                                                   dst=ROUTER_MAC) / inner)))
        path = DIR / f"frame-{proto}.bin"
        path.write_bytes(bytes(frame))
        return path

    def rate(self, proto: str, mode: str, seconds: float) -> tuple[float, float]:
        """(packets/s that arrived where they should, packets/s offered)."""
        frame, pin = self.template(proto), ["taskset", "-c", str(min(os.sched_getaffinity(0)))]
        gen = [*pin, str(generator()), "ul0", str(seconds), str(frame), str(self.ipoff), mode, "1000"]
        if mode == "flows":  # the flows exist before the measurement
            ns(C, *pin, str(generator()), "ul0", "0.3", str(frame), str(self.ipoff), mode, "1000")
            time.sleep(1.0)
        before = self.counted_packets()
        sent, elapsed = (float(x) for x in ns(C, *gen).stdout.split())
        time.sleep(0.5)
        return (self.counted_packets() - before) / elapsed, sent / elapsed

    def down(self) -> None:
        stop(self.proc)
        self.proc = None
        (DIR / "gateway-lab.json").unlink(missing_ok=True)  # the next instance's status, not this one's
        for n in (C, L, S):
            sh("ip", "netns", "del", n, check=False)


KERNEL_OVERLAY = "Linux kernel: VXLAN, nftables Maglev DNAT, conntrack"
KERNEL_PLAIN = "Linux kernel, plain IP (no overlay)"


def compare(fastpaths: list[str], seconds: float) -> list[tuple[str, str, float, float]]:
    """Rows (balancer, measure, achieved/s, offered/s): the kernel doing the instance's job (KERNEL_OVERLAY),
    the kernel's lighter plain-IP job, and each tianji fast path."""
    rows = []
    lab = Lab()
    try:
        for who in ["kernel-overlay", "kernel-plain", *fastpaths]:
            if who.startswith("kernel"):
                lab.kernel(overlay=who == "kernel-overlay")
                used = KERNEL_OVERLAY if who == "kernel-overlay" else KERNEL_PLAIN
            else:
                used = f"tianji LB instance, fast path {lab.tianji(who)}"
            for label, proto, mode in (("forwarded 64-byte UDP packets/s (1,000 flows)", "udp", "flows"),
                                       ("new TCP connections/s (every SYN a new 5-tuple)", "tcp", "new")):
                got, offered = lab.rate(proto, mode, seconds)
                rows.append((used, label, got, offered))
            lab.down()
    finally:
        lab.down()
    return rows
