"""The gateway framework: what every gateway role shares, written once. A role (NAT today; load balancer and private
line next) plugs in by subclassing `Gateway` and supplying its policy per VPC section, its packet stage (the
Python reference of its semantics, or the native data plane that runs the same in C) and its status.

An instance is a VTEP on the underlay and an Ethernet port on the external segment. Two ways to move packets,
chosen by `--fastpath`:

* native (`dpdk`, `xdp`, `packet`; `auto` takes the best that starts): the C data plane (dataplane.py, native/)
  owns both interfaces, decapsulates, runs the role's stage on established flows, encapsulates and transmits in
  bursts. It punts what it cannot decide (ARP, new flows, ICMP errors...) to `punt_loop`, which runs the same
  Python code as the socket path below and sends its answers back through the data plane. On the underlay, the
  instance itself answers ARP for its VTEP address and resolves the hypervisors' VTEPs.
* sockets (`c`, `python`): tenant traffic arrives in VXLAN on a UDP socket bound to the VTEP address (the kernel
  decapsulates); the external side is an AF_PACKET socket.

Either way replies go back in VXLAN to the VTEP of the host holding the destination port, with the VPC's VNI and
router MAC, and on the external side the instance answers ARP for the addresses it serves and resolves its next
hops. The framework owns: registration and heartbeat, the config watch (a delta per VPC section), VTEP and
underlay handling, neighbours and ARP, the punt/inject slow path, status file and metrics."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import struct
import threading
import time
from array import array
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from nfv_gateways import metrics
from nfv_gateways.dataplane import EXT, PUNT_TRANSLATED, UL
from nfv_gateways.packet import Verdict, ip2int
from nfv_gateways.underlay import (
    BCAST,
    ETH_ARP,
    ETH_IP,
    ETH_P_ALL,
    PACKET_OUTGOING,
    VXLAN_PORT,
    mac_bytes,
    vxlan_ip_udp,
)
from tianji.inet import checksum
from tianji.southbound import (
    Endpoint,
    GatewayConfig,
    GatewayConfigDelta,
    GatewayHeld,
    GatewaySection,
    GatewayVpc,
    apply_gateway_delta,
    vtep_interface,
)
from tianji.southbound_client import Southbound
from tianji.statusfile import write_atomic

__all__ = ["EXT", "ROLES", "UL", "Gateway", "GatewayOptions", "PacketStage", "VpcParts", "ip2int", "role_class"]

log = logging.getLogger("tianji.gateway")
ROLES = {"nat": "nfv_gateways.nat_role:NatGateway"}  # role -> its Gateway subclass (imported when run)
FASTPATHS = ("auto", "dpdk", "xdp", "packet", "c", "python")
GARP_REPEAT_S = 1.2  # an announcement is repeated once (RFC 5227 sends two): one lost frame does not strand an address


class PacketStage(Protocol):
    """A role's packet semantics (the Python reference, or the C stage behind the native data plane)."""

    counters: Any

    def outbound(self, vni: int, buf: bytearray, now: float) -> Verdict | None: ...
    def inbound(self, buf: bytearray, now: float) -> Verdict | None: ...
    def expire(self, now: float) -> int: ...


def role_class(role: str) -> type[Gateway]:
    """The Gateway subclass that runs `role`; SystemExit naming the roles there are for an unknown one."""
    if role not in ROLES:
        raise SystemExit(f"role {role!r} is not available: choose one of {', '.join(sorted(ROLES))}")
    module, cls = ROLES[role].split(":")
    import importlib

    return getattr(importlib.import_module(module), cls)


@dataclass(frozen=True)
class VpcParts:
    """What one VPC's section contributes, in the forms the role's stage and the data plane take: built once per
    section received, so that an apply costs the sections that changed, not the 1,000 others."""

    vni: int
    router_mac: bytes
    endpoints: tuple[tuple[tuple[int, int], tuple[str, bytes, int]], ...]  # (VNI, IP) -> (VTEP, MAC, VTEP as int)
    packed: tuple[bytes, bytes, bytes, bytes]  # the endpoints as the data plane takes them (set_config)
    policy: tuple  # the role's own part (compared, never looked into, by the framework)

    def wire(self) -> tuple:
        """What the data plane takes from this VPC (the packed endpoints follow from `endpoints`)."""
        return self.endpoints, self.router_mac


def wire_parts(vpc: GatewayVpc, endpoints: list[Endpoint], policy: tuple) -> VpcParts:
    eps = tuple(((e.vni, ip2int(e.ip)), (e.vtep_ip, mac_bytes(e.mac), ip2int(e.vtep_ip))) for e in endpoints)
    packed = (array("I", [k[0] for k, _ in eps]).tobytes(), array("I", [k[1] for k, _ in eps]).tobytes(),
              array("I", [v[2] for _, v in eps]).tobytes(), b"".join(v[1] for _, v in eps))
    return VpcParts(vpc.vni, mac_bytes(vpc.router_mac), eps, packed, policy)


def sections_of(cfg: GatewayConfig) -> dict[str, GatewaySection]:
    """A whole config cut into its VPCs' sections (a VNI names one VPC)."""
    static, dnat, eps = defaultdict(list), defaultdict(list), defaultdict(list)
    for x in cfg.static:
        static[x.vni].append(x)
    for d in cfg.dnat:
        dnat[d.vni].append(d)
    for e in cfg.endpoints:
        eps[e.vni].append(e)
    return {v.id: GatewaySection.model_construct(vpc=v, static=static[v.vni], dnat=dnat[v.vni],
                                                 endpoints=eps[v.vni], eips=[]) for v in cfg.vpcs}


@dataclass
class GatewayOptions:
    name: str
    controller: str
    token: str
    underlay_if: str
    vtep_ip: str
    external_if: str
    fastpath: str = "auto"
    state_dir: Path = field(default_factory=lambda: Path("/run/tianji"))
    metrics_port: int = 9477  # Prometheus text on 127.0.0.1 (in the gateway host's namespace)
    config_file: Path | None = None  # standalone: a fixed GatewayConfig instead of the controller (benchmarks, labs)
    macs: tuple[str, str] | None = None  # (underlay, external) instead of reading the interfaces (tests)
    # a beat this often: the controller moves an instance's addresses after TIANJI_GATEWAY_DOWN_AFTER of silence
    # (2 s by default, 0.5 s on the emulated cluster), so failover takes that, a liveness tick, and the propagation
    beat_interval: float = 0.1


class Gateway:
    """The framework's instance. A role overrides: `make_stage` (its stage and the data plane, by --fastpath),
    `policy_of` (its part of a VPC's section), `apply_policy` (install the policy of the VPCs that changed) and
    `role_status`."""

    role = "gateway"

    def __init__(self, o: GatewayOptions, dataplane: Any = None) -> None:
        self.o = o
        self.api = Southbound(o.controller, o.token)
        self.vtep = str(vtep_interface(o.vtep_ip).ip)
        self.revision: int | None = None  # of the config applied
        self.eips: list[str] = []  # homed here (answered ARP for)
        self.counters: Counter[str] = Counter()
        self.parts: dict[str, VpcParts] = {}  # VPC id -> what its section contributes (applied)
        self.apply_ms: deque[float] = deque(maxlen=32)  # the last answers: received -> applied
        self.compile_ms: deque[float] = deque(maxlen=32)  # ... and the controller's time to make them
        self.garp_again: list[tuple[float, list[str]]] = []  # (when, addresses) to announce once more
        self.endpoints: dict[tuple[int, int], tuple[str, bytes, int]] = {}  # (VNI, IP) -> (VTEP, MAC, VTEP)
        self.router_mac: dict[int, bytes] = {}
        self.vteps: set[str] = set()
        self.served: set[int] = set()
        self.arp: dict[int, dict[int, bytes]] = {UL: {}, EXT: {}}
        self.pending: dict[int, dict[int, list[bytes]]] = {UL: defaultdict(list), EXT: defaultdict(list)}
        self.lock = threading.Lock()
        macs = o.macs or tuple(Path(f"/sys/class/net/{i}/address").read_text().strip()
                               for i in (o.underlay_if, o.external_if))
        self.mac = {UL: mac_bytes(macs[0]), EXT: mac_bytes(macs[1])}
        self.vtep_int = ip2int(self.vtep)
        self.dp = dataplane  # given: a data plane built by the caller (tests); else chosen by --fastpath
        if self.o.fastpath not in FASTPATHS:
            raise SystemExit(f"--fastpath {self.o.fastpath}: choose one of {', '.join(FASTPATHS)}")
        self.table, self.fastpath = self.make_stage()

    # --- what a role supplies ------------------------------------------------------------------------------------
    def make_stage(self) -> tuple[PacketStage, str]:
        """The role's packet stage and a description of the fast path chosen (sets self.dp for a native one)."""
        raise NotImplementedError

    def policy_of(self, section: Any) -> tuple:
        """The role's part of one VPC's section (hashable, compared for equality)."""
        raise NotImplementedError

    def apply_policy(self, parts: dict[str, VpcParts], touched: set[str], first: bool) -> None:
        """Install the policy of `parts` (every VPC held), knowing which VPCs' sections changed."""
        raise NotImplementedError

    def role_status(self) -> dict:
        return {}

    # --- controller ----------------------------------------------------------------------------------------------
    def parts_of(self, section: Any) -> VpcParts:
        return wire_parts(section.vpc, section.endpoints, self.policy_of(section))

    def apply(self, cfg: GatewayConfig) -> None:
        """Apply a whole config (a config file, tests): what differs from what is held, as apply_parts does."""
        self.apply_parts(cfg.revision, cfg.eips, cfg.vteps,
                         {v: self.parts_of(x) for v, x in sections_of(cfg).items()}, whole=True)

    def apply_sections(self, held: GatewayHeld, changed: set[str]) -> None:
        """Apply a delta's outcome: the sections of `changed` (a VPC whose section went is gone)."""
        parts = {v: self.parts_of(x) if (x := held.sections.get(v)) else None for v in changed}
        eips = sorted({a for x in held.sections.values() for a in x.eips})
        self.apply_parts(held.revision, eips, held.vteps, parts, whole=False)

    def apply_parts(self, revision: int, eips: list[str], vteps_cfg: list, new: dict[str, VpcParts | None],
                    whole: bool) -> None:
        """Apply what differs from what is held. `new`: VPC id -> its parts (None: gone); `whole`: `new` is every
        VPC (the others go). The role's policy is installed only if a VPC's policy differs, the data plane's
        endpoints only if a VPC's endpoints or the VTEPs differ, and a gratuitous ARP goes for each address newly
        homed here, not for every address on every change."""
        first = self.revision is None
        parts = {} if whole else dict(self.parts)
        for vid, p in new.items():
            if p is None:
                parts.pop(vid, None)
            else:
                parts[vid] = p
        touched = {v for v in parts.keys() | self.parts.keys()
                   if parts.get(v) is not self.parts.get(v) and parts.get(v) != self.parts.get(v)}

        def differ(side: Callable[[VpcParts], tuple]) -> bool:
            return any((side(p) if p else None) != (side(q) if q else None)
                       for p, q in ((parts.get(v), self.parts.get(v)) for v in touched))

        vteps = {v.ip for v in vteps_cfg}
        policy_moved = first or differ(lambda p: p.policy)
        moved = first or vteps != self.vteps or differ(VpcParts.wire)
        old_eips = set(self.eips)
        with self.lock:
            self.revision, self.eips = revision, eips
            if policy_moved:
                self.apply_policy(parts, touched, first)
            for v in touched:
                if (q := self.parts.get(v)) is not None:
                    for k, _ in q.endpoints:
                        self.endpoints.pop(k, None)
                    self.router_mac.pop(q.vni, None)
            for v in touched:
                if (p := parts.get(v)) is not None:
                    self.endpoints.update(p.endpoints)
                    self.router_mac[p.vni] = p.router_mac
            self.parts, self.vteps = parts, vteps
            self.served = {ip2int(e) for e in eips}
            if self.dp is not None and moved:
                self.dp.set_config([ip2int(v) for v in self.vteps], self.router_mac, [p.packed for p in parts.values()])
                self.counters["config_endpoint_applies"] += 1
        self.counters["config_applies"] += 1
        if self.dp is not None:  # resolve the hypervisors' VTEPs before their first packet needs them
            for v in self.vteps - {self.vtep}:
                if ip2int(v) not in self.arp[UL]:
                    self.send_arp(UL, 1, self.vtep_int, ip2int(v), b"\0" * 6)
        new_eips = sorted(set(eips) - old_eips)
        log.info("config revision %d: %d VPCs (%d changed), %d EIPs (%d newly homed here), %d endpoints", revision,
                 len(parts), len(touched), len(eips), len(new_eips), len(self.endpoints))
        self.announce(new_eips)
        if new_eips:
            self.garp_again.append((time.monotonic() + GARP_REPEAT_S, new_eips))

    def announce(self, eips: list[str], repeat: bool = False) -> None:
        """Gratuitous ARP for addresses this instance homes: the external segment learns that they live here now.
        The request form (RFC 5227 announcement, as `arping -U` sends): Linux overrides an entry with it at once,
        while a broadcast reply whose target MAC is not the sender's counts as gratuitous only after the locktime."""
        for eip in eips:
            if repeat and ip2int(eip) not in self.served:
                continue  # moved on again meanwhile
            self.send_arp(EXT, 1, ip2int(eip), ip2int(eip), b"\0" * 6)
            self.counters["gratuitous_arps"] += 1

    def watch_loop(self) -> None:
        """Long-poll the controller for the sections (one per VPC) that changed, with the revision and the digest
        of the config held: the controller answers only when this instance's config differs, so a write
        elsewhere costs it nothing, and a write in one tenant sends that tenant's section."""
        held, digest = GatewayHeld(), ""
        while True:
            try:
                r = self.api.poll(f"/v1/gateways/{self.o.name}/config/delta?after={held.revision}&timeout=25"
                                  + (f"&digest={digest}" if digest else ""))
                if r.status == 304:
                    continue
                got_digest, timing = r.headers.get("X-Tianji-Config-Digest", ""), r.headers.get("Server-Timing", "")
                t_got = time.perf_counter()
                d = GatewayConfigDelta.model_validate_json(r.body)
                self.counters["config_downloads"] += 1
                out = apply_gateway_delta(held, d)
                if out is None:  # not on what is held: ask for every section
                    held, digest = GatewayHeld(), ""
                    continue
                held, changed = out
                digest = got_digest
                self.apply_sections(held, changed)
                self.apply_ms.append(round((time.perf_counter() - t_got) * 1000, 2))
                if "dur=" in timing:
                    self.compile_ms.append(float(timing.split("dur=")[1].split(";")[0].split(",")[0]))
            except Exception as e:  # keep serving with the last config through controller outages
                self.counters["watch_errors"] += 1
                log.warning("watch: %s", e)
                time.sleep(1)

    def heartbeat_loop(self) -> None:
        while True:
            try:
                if not self.counters["registered"]:
                    self.api.register(self.o.name, self.vtep, "gateway")
                    self.counters["registered"] = 1
                self.api.beat(self.o.name, {"ports": {}})
            except Exception as e:
                self.counters["registered"] = 0
                log.warning("heartbeat: %s", e)
            self.write_status()
            time.sleep(self.o.beat_interval)

    def status_loop(self) -> None:
        while True:
            self.write_status()
            now = time.monotonic()
            due = [eips for at, eips in self.garp_again if at <= now]
            self.garp_again = [(at, eips) for at, eips in self.garp_again if at > now]
            for eips in due:
                self.announce(eips, repeat=True)
            time.sleep(0.5)

    def expiry_loop(self) -> None:
        while True:
            time.sleep(5)
            with self.lock:
                self.counters["expired"] += self.table.expire(time.time())

    # --- data plane ----------------------------------------------------------------------------------------------
    def open_sockets(self) -> None:
        if self.dp is not None:
            return
        self.vx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.vx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.vx.bind((self.vtep, VXLAN_PORT))
        self.ext = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.ext.bind((self.o.external_if, 0))

    def tx(self, port: int, frame: bytes) -> None:
        if self.dp is not None:
            if not self.dp.inject(port, frame):
                self.counters["drop_inject_full"] += 1
        elif port == EXT:
            self.ext.send(frame)
        else:  # socket mode: the kernel encapsulates nothing for us; VXLAN goes out via self.vx in to_tenant
            raise ValueError("underlay frames are sent by the kernel in socket mode")

    def punt_loop(self) -> None:
        """What the native data plane did not decide: ARP, new flows, hairpin, ICMP errors, unknown neighbours."""
        while True:
            for port, frame in self.dp.punt(100):
                self.handle_punt(port, frame)

    def handle_punt(self, port: int, frame: bytes) -> None:
        try:
            if port == UL:
                self.from_underlay(frame)
            elif port == EXT:
                self.from_external(frame)
            elif port == PUNT_TRANSLATED:  # translated by the data plane, VNI and inside IP in the MAC fields
                self.to_tenant(int.from_bytes(frame[0:4], "big"), int.from_bytes(frame[4:8], "big"), frame[14:])
        except Exception as e:  # a malformed packet never takes the gateway down
            self.counters["drop_error"] += 1
            log.debug("punted packet: %s", e)

    def ipv4_for_us(self, port: int, frame: bytes) -> bytes | None:
        """The IPv4 packet of a frame addressed to our MAC on `port`; ARP is handled here, the rest ignored."""
        if len(frame) < 14:
            self.counters["drop_malformed"] += 1
            return None
        etype = struct.unpack_from("!H", frame, 12)[0]
        if etype == ETH_ARP:
            self.on_arp(port, frame)
            return None
        if etype != ETH_IP or frame[0:6] != self.mac[port]:
            return None
        return frame[14:]

    def from_underlay(self, frame: bytes) -> None:
        """An underlay frame in native mode: ARP for our VTEP, or VXLAN the data plane left to Python."""
        ip = self.ipv4_for_us(UL, frame)
        if ip is None:
            return
        if (len(ip) < 28 or ip[0] != 0x45 or ip[9] != 17 or int.from_bytes(ip[16:20], "big") != self.vtep_int
                or struct.unpack_from("!H", ip, 22)[0] != VXLAN_PORT):
            self.counters["drop_underlay_not_vxlan"] += 1
            return
        if struct.unpack_from("!H", ip, 6)[0] & 0x3FFF or checksum(ip[:20]) != 0:
            self.counters["drop_malformed"] += 1  # outer fragments (the underlay MTU carries VXLAN whole) or bad sums
            return
        self.from_tenant(ip[28:], socket.inet_ntoa(ip[12:16]))

    def vxlan_loop(self) -> None:
        while True:
            data, (src, _port) = self.vx.recvfrom(65535)
            try:
                self.from_tenant(data, src)
            except Exception as e:  # a malformed packet never takes the gateway down
                self.counters["drop_error"] += 1
                log.debug("tenant packet: %s", e)

    def from_tenant(self, data: bytes, src: str) -> None:
        if src not in self.vteps:
            self.counters["drop_unknown_vtep"] += 1
            return
        if len(data) < 8 + 14 + 20 or data[0] & 0x08 == 0:
            self.counters["drop_malformed"] += 1
            return
        vni = int.from_bytes(data[4:7], "big")
        if vni not in self.router_mac:
            self.counters["drop_unknown_vni"] += 1
            return
        if struct.unpack_from("!H", data, 8 + 12)[0] != ETH_IP:
            self.counters["drop_not_ipv4"] += 1
            return
        buf = bytearray(data[8 + 14:])
        with self.lock:
            v = self.table.outbound(vni, buf, time.time())
        if v is None:
            self.counters["drop_nat"] += 1
        else:
            self.deliver(v, buf)

    def ext_loop(self) -> None:
        while True:
            frame, addr = self.ext.recvfrom(65535)
            if addr[2] == PACKET_OUTGOING:
                continue
            try:
                self.from_external(frame)
            except Exception as e:
                self.counters["drop_error"] += 1
                log.debug("external packet: %s", e)

    def from_external(self, frame: bytes) -> None:
        ip = self.ipv4_for_us(EXT, frame)
        if ip is None:
            return
        buf = bytearray(ip)
        with self.lock:
            v = self.table.inbound(buf, time.time())
        if v is None:
            self.counters["drop_nat_in"] += 1
            return
        self.deliver(v, buf)

    def deliver(self, v: Verdict, buf: bytearray) -> None:
        """Where the stage said: out to the internet (a translated packet, or an ICMP error the gateway answers
        with), or into a VPC, whole or as the fragments that fit the VPC's MTU."""
        if v.direction == "out":
            self.to_external(bytes(buf))
            return
        for pkt in v.fragments or (bytes(buf),):
            self.to_tenant(v.vni, v.ip, pkt)

    # --- neighbours ----------------------------------------------------------------------------------------------
    def on_arp(self, port: int, frame: bytes) -> None:
        """Learn the sender, release what waited for it, answer for our addresses (EIPs outside, the VTEP inside)."""
        if len(frame) < 42 or frame[14:20] != b"\x00\x01\x08\x00\x06\x04":
            self.counters["drop_malformed_arp"] += 1
            return
        op = struct.unpack_from("!H", frame, 20)[0]
        sha, spa, tpa = frame[22:28], int.from_bytes(frame[28:32], "big"), int.from_bytes(frame[38:42], "big")
        if spa and sha != BCAST and not sha[0] & 1:
            if self.arp[port].get(spa) != sha:
                self.arp[port][spa] = sha
                if self.dp is not None:
                    self.dp.set_neigh(port, spa, sha)
            for pkt in self.pending[port].pop(spa, []):
                self.tx(port, sha + self.mac[port] + struct.pack("!H", ETH_IP) + pkt)
        ours = tpa in self.served if port == EXT else tpa == self.vtep_int
        if op == 1 and ours:
            self.send_arp(port, 2, tpa, spa, sha)

    def send_arp(self, port: int, op: int, spa: int, tpa: int, tha: bytes) -> None:
        dst = tha if op == 2 and tha != BCAST else BCAST
        body = struct.pack("!HHBBH6s4s6s4s", 1, ETH_IP, 6, 4, op, self.mac[port], spa.to_bytes(4, "big"),
                           tha if op == 2 else b"\0" * 6, tpa.to_bytes(4, "big"))
        self.tx(port, dst + self.mac[port] + struct.pack("!H", ETH_ARP) + body)

    def resolve_and_send(self, port: int, nexthop: int, pkt: bytes, spa: int) -> None:
        """Send an IPv4 packet to an on-link next hop, resolving its MAC first when needed (packets wait, 64 max)."""
        mac = self.arp[port].get(nexthop)
        if mac is None:
            q = self.pending[port][nexthop]
            if len(q) < 64:
                q.append(pkt)
            self.send_arp(port, 1, spa, nexthop, b"\0" * 6)
            self.counters["arp_pending"] += 1
            return
        self.tx(port, mac + self.mac[port] + struct.pack("!H", ETH_IP) + pkt)
        self.counters["tx_external" if port == EXT else "tx_tenant"] += 1

    def to_external(self, pkt: bytes) -> None:
        # every destination is on-link on the external segment (the emulated internet); a real deployment would
        # name its upstream router here
        self.resolve_and_send(EXT, int.from_bytes(pkt[16:20], "big"), pkt, next(iter(self.served), 0))

    def to_tenant(self, vni: int, ip: int, pkt: bytes) -> None:
        ep = self.endpoints.get((vni, ip))
        if ep is None or vni not in self.router_mac:
            self.counters["drop_no_endpoint"] += 1
            return
        vtep, mac, vtep_int = ep
        inner = mac + self.router_mac[vni] + struct.pack("!H", ETH_IP) + pkt
        vx = b"\x08\0\0\0" + vni.to_bytes(3, "big") + b"\0" + inner
        if self.dp is None:
            self.vx.sendto(vx, (vtep, VXLAN_PORT))
            self.counters["tx_tenant"] += 1
            return
        self.resolve_and_send(UL, vtep_int, vxlan_ip_udp(self.vtep_int, vtep_int, pkt, vx), self.vtep_int)

    # --- status --------------------------------------------------------------------------------------------------
    def status(self) -> dict:
        return {"name": self.o.name, "role": self.role, "fastpath": self.fastpath, "revision": self.revision,
                "eips": self.eips, "counters": dict(self.counters), "pid": os.getpid(), "updated": time.time(),
                "dataplane": self.dp.stats() if self.dp is not None else {},
                "last_applies_ms": list(self.apply_ms), "last_compiles_ms": list(self.compile_ms)} \
            | self.role_status()

    def write_status(self) -> None:
        write_atomic(self.o.state_dir / f"gateway-{self.o.name}.json", json.dumps(self.status(), indent=1))

    def metrics(self) -> bytes:
        return metrics.exposition(self)

    def run(self) -> None:
        self.open_sockets()
        log.info("gateway %s (%s): VTEP %s on %s, external %s, fast path: %s", self.o.name, self.role, self.vtep,
                 self.o.underlay_if, self.o.external_if, self.fastpath)
        io = (self.punt_loop,) if self.dp is not None else (self.vxlan_loop, self.ext_loop)
        if self.dp is not None:
            self.dp.start()
        control: tuple = (self.heartbeat_loop, self.watch_loop)
        if self.o.config_file is not None:
            self.apply(GatewayConfig.model_validate_json(self.o.config_file.read_text()))
            control = (self.status_loop,)
        for fn in (*control, *io, self.expiry_loop, lambda: metrics.serve(self, self.o.metrics_port)):
            threading.Thread(target=fn, name=getattr(fn, "__name__", "metrics"), daemon=True).start()
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_a: stop.set())
        try:
            stop.wait()
        finally:  # detach XDP programs and nftables rules: left behind, they would eat the next instance's traffic
            if self.dp is not None:
                self.dp.close()
            log.info("gateway %s stopped", self.o.name)
