"""The underlay's neighbours, resolved before they are needed. With the userspace datapath Open vSwitch tunnels
natively: the VXLAN packet's next hop comes from its own neighbour cache (`tnl/neigh`, filled by snooping ARP on
br-phy), and a miss drops the packet while it ARPs. So the first packet to a host or a gateway instance this
hypervisor had not spoken to (a new endpoint's first SYN, a new peer's first ping) was lost, and TCP waited a
second to send it again. The agent resolves every registered VTEP itself when it first appears, and again when
the cache has let one go, by sending an ARP request from br-phy's own address: the answer fills the cache.

Cost: one ARP per new VTEP (a host joining costs each other host one), the cache's ageing raised to its hour
(entries in use are refreshed by their use), and a look at the cache every RECHECK_S for those it dropped."""

from __future__ import annotations

import ipaddress
import logging
import socket
import struct
import subprocess
import time
from collections.abc import Callable, Iterable

from vswitch_agent.live_trace import appctl_target

log = logging.getLogger("tianji.agent")
BRIDGE = "br-phy"
AGING_S = 3600  # OVS's longest: an idle entry is dropped after this (one in use never is)
RECHECK_S = 30.0  # how often the cache is read for entries it dropped
PER_PASS = 200  # ARP requests sent at most per pass (a host joining a thousand-host cluster spreads them)


def arp_request(src_mac: bytes, src_ip: str, target: str) -> bytes:
    return (b"\xff" * 6 + src_mac + b"\x08\x06" +
            struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, src_mac, socket.inet_aton(src_ip), b"\0" * 6,
                        socket.inet_aton(target)))


def cached(show: str) -> set[str]:
    """The addresses in `ovs-appctl tnl/neigh/show`'s table."""
    out = set()
    for line in show.splitlines():
        first = line.split()[0] if line.split() else ""
        try:
            out.add(str(ipaddress.ip_address(first)))
        except ValueError:
            continue
    return out


class UnderlayNeighbours:
    def __init__(self, rundir: str | None, local_ip: str, bridge: str = BRIDGE) -> None:
        self.rundir, self.local_ip, self.bridge = rundir, local_ip, bridge
        self.wanted: set[str] = set()
        self.known: set[str] = set()  # in the cache at the last look
        self.asked: dict[str, float] = {}
        self.next_check = 0.0
        self.sent = 0

    def want(self, vteps: Iterable[str]) -> None:
        """The VTEPs this host may tunnel to (the config's registered ones, but its own)."""
        wanted = {v for v in vteps if v and v != self.local_ip}
        if wanted - self.wanted:
            self.next_check = 0.0  # new ones: resolve them now
        self.wanted = wanted

    def _appctl(self, *args: str) -> str:
        r = subprocess.run(["ovs-appctl", *appctl_target(self.rundir), *args], capture_output=True, text=True,
                           timeout=10)
        if r.returncode != 0:
            raise RuntimeError(f"ovs-appctl {' '.join(args)}: {r.stderr.strip()[:200]}")
        return r.stdout

    def step(self, now: float) -> int:
        """Ask for the wanted VTEPs the cache lacks (each at most once a RECHECK_S); returns how many."""
        if now < self.next_check or not self.wanted:
            return 0
        self.next_check = now + RECHECK_S
        self.known = cached(self._appctl("tnl/neigh/show"))
        missing = sorted(v for v in self.wanted - self.known if now - self.asked.get(v, -RECHECK_S) >= RECHECK_S)
        if not missing:
            return 0
        batch = missing[:PER_PASS]
        if len(missing) > PER_PASS:
            self.next_check = now + 1.0  # the rest in a second
        with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
            s.bind((self.bridge, 0))
            mac = s.getsockname()[4][:6]
            for v in batch:
                s.send(arp_request(mac, self.local_ip, v))
                self.asked[v] = now
        self.sent += len(batch)
        return len(batch)

    def run(self, sleep: Callable[[float], None]) -> None:
        try:
            self._appctl("tnl/neigh/aging", str(AGING_S))
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            log.warning("underlay neighbours: ageing left as it is (%s)", e)
        while True:
            try:
                self.step(time.monotonic())
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                log.warning("underlay neighbours: %s", e)
            sleep(1.0)
