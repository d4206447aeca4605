"""The gateway framework: what every gateway role shares, written once. A role (NAT today; load balancer and private
line next) plugs in by subclassing `Gateway` and supplying its policy per VPC section, its packet stage (the
Python reference of its semantics, or the native data plane that runs the same in C) and its status.

An instance is a VTEP on the underlay and an Ethernet port on the external segment. Two ways to move packets,
chosen by `--fastpath`:

* native (`dpdk`, `xdp`, `packet`; `auto` takes the best that starts): the C data plane (dataplane.py, native/)
  owns both interfaces, decapsulates, runs the role's stage (new and established flows), encapsulates and
  transmits in bursts. It punts what it cannot decide (ARP, hairpin, ICMP errors...) to `punt_loop`, which runs the same
  Python code as the socket path below and sends its answers back through the data plane. On the underlay, the
  instance itself answers ARP for its VTEP address and resolves the hypervisors' VTEPs.
* sockets (`python`, the reference of every role's semantics): tenant traffic arrives in VXLAN on a UDP socket
  bound to the VTEP address (the kernel decapsulates); the external side is an AF_PACKET socket.

Either way replies go back in VXLAN to the VTEP of the host holding the destination port, with the VPC's VNI and
router MAC, and on the external side the instance answers ARP for the addresses it serves and resolves its next
hops. The framework owns: registration and heartbeat, the config watch (a delta per VPC section), VTEP and
underlay handling, neighbours and ARP, the punt/inject slow path, status file and metrics."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from array import array
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from nfv_gateways import metrics
from nfv_gateways.dataplane import EXT, UL
from nfv_gateways.packet import Verdict, ip2int
from nfv_gateways.packet_io import PacketIO
from nfv_gateways.underlay import (
    mac_bytes,
)
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
from tianji.southbound_client import Answer, Southbound
from tianji.statusfile import write_atomic

__all__ = ["EXT", "ROLES", "UL", "Gateway", "GatewayOptions", "PacketStage", "VpcParts", "ip2int", "role_class"]

log = logging.getLogger("tianji.gateway")
# role -> its Gateway subclass (imported when run)
ROLES = {"nat": "nfv_gateways.nat_role:NatGateway", "lb": "nfv_gateways.lb_role:LbGateway"}
FASTPATHS = ("auto", "dpdk", "xdp", "packet", "python")
GARP_REPEAT_S = 1.2  # an announcement is repeated once (RFC 5227 sends two): one lost frame does not strand an address


class PacketStage(Protocol):
    """A role's packet semantics (the Python reference, or the C stage behind the native data plane)."""

    counters: Any

    def outbound(self, vni: int, buf: bytearray, now: float) -> Verdict | None: ...
    def inbound(self, buf: bytearray, now: float) -> Verdict | None: ...
    def expire(self, now: float) -> int: ...
    def absorb(self) -> None:
        """Take in what the native data plane decided on its own (the NAT's new mappings); may do nothing."""


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
    static, dnat, eps, lbs = defaultdict(list), defaultdict(list), defaultdict(list), defaultdict(list)
    for b in cfg.lbs:
        lbs[b.vni].append(b)
    for x in cfg.static:
        static[x.vni].append(x)
    for d in cfg.dnat:
        dnat[d.vni].append(d)
    for e in cfg.endpoints:
        eps[e.vni].append(e)
    return {v.id: GatewaySection.model_construct(vpc=v, static=static[v.vni], dnat=dnat[v.vni],
                                                 endpoints=eps[v.vni], eips=[], lbs=lbs[v.vni])
            for v in cfg.vpcs}


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
    nat_mappings: int = 1 << 18  # the NAT's mapping table in C: its slots (a power of two; 3/4 are ever used)
    # the load balancer's connection table: its slots (a power of two; 3/4 of them are ever used) and the rate of
    # new entries it takes (a token bucket holding a tenth of a second's worth): above it, Maglev alone decides
    lb_connections: int = 1 << 20
    lb_new_per_s: float = 100_000.0


class Gateway(PacketIO):
    """The framework's instance. A role overrides: `make_stage` (its stage and the data plane, by --fastpath),
    `policy_of` (its part of a VPC's section), `apply_policy` (install the policy of the VPCs that changed) and
    `role_status`."""

    role = "gateway"
    expiry_interval = 5.0  # seconds between expiry passes

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

    def lb_table_args(self) -> tuple[int, float, int]:
        """(capacity, new entries per second, burst) of a load balancer's connection table."""
        rate = self.o.lb_new_per_s
        return self.o.lb_connections, rate, max(1, int(rate / 10))

    def native_dataplane(self, stage: str) -> Any:
        """The native data plane for --fastpath (auto: the best backend that starts, saying why others did not),
        with this role's stage in it; None when --fastpath names no native backend or auto found none."""
        from nfv_gateways.dataplane import BACKENDS, NativeDataPlane

        fp = self.o.fastpath
        for backend in BACKENDS if fp == "auto" else (fp,) if fp in BACKENDS else ():
            try:
                return NativeDataPlane(backend, self.o.name, self.o.underlay_if, self.o.external_if, self.mac[UL],
                                       self.mac[EXT], self.vtep_int, capacity_pow2=self.o.nat_mappings, stage=stage,
                                       lb_table=self.lb_table_args())
            except Exception as e:  # auto goes on to the next backend, and says why
                if fp != "auto":
                    raise SystemExit(f"--fastpath {fp} does not work here: {e}") from e
                log.warning("fast path %s unavailable: %s", backend, e)
        return None

    def policy_of(self, section: Any) -> tuple:
        """The role's part of one VPC's section (hashable, compared for equality)."""
        raise NotImplementedError

    def apply_policy(self, parts: dict[str, VpcParts], touched: set[str], first: bool) -> None:
        """Install the policy of `parts` (every VPC held), knowing which VPCs' sections changed."""
        raise NotImplementedError

    def role_status(self) -> dict:
        return {}

    def expire_role(self, now: float) -> None:
        """The role's own timers, every `expiry_interval` seconds (under the lock)."""

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
        self.held, self.digest = GatewayHeld(), ""

        def params() -> dict[str, Any]:
            return {"after": self.held.revision} | ({"digest": self.digest} if self.digest else {})

        def error(e: Exception) -> None:  # keep serving with the last config through controller outages
            self.counters["watch_errors"] += 1
            log.warning("watch: %s", e)

        self.api.watch(f"/v1/gateways/{self.o.name}/config/delta", GatewayConfigDelta, params, self.take_delta,
                       error)

    def take_delta(self, d: GatewayConfigDelta, answer: Answer) -> None:
        t_got = time.perf_counter()
        self.counters["config_downloads"] += 1
        out = apply_gateway_delta(self.held, d)
        if out is None:  # not on what is held: ask for every section
            self.held, self.digest = GatewayHeld(), ""
            return
        self.held, changed = out
        self.digest = answer.headers.get("X-Tianji-Config-Digest", "")
        self.apply_sections(self.held, changed)
        self.apply_ms.append(round((time.perf_counter() - t_got) * 1000, 2))
        if "dur=" in (timing := answer.headers.get("Server-Timing", "")):
            self.compile_ms.append(float(timing.split("dur=")[1].split(";")[0].split(",")[0]))

    def heartbeat_loop(self) -> None:
        while True:
            try:
                if not self.counters["registered"]:
                    self.api.register(self.o.name, self.vtep, "gateway", self.role)
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
            time.sleep(self.expiry_interval)
            with self.lock:
                now = time.time()
                self.counters["expired"] += self.table.expire(now)
                self.expire_role(now)

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
            self.dp.start(own_core=True)
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
