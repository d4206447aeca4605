"""A gateway instance: what every role shares, written once, with the role handed to it (`role.Role`).

An instance is a VTEP on the underlay and an Ethernet port on the external segment. Two ways to move packets,
chosen by `--fastpath`:

* native (`dpdk`, `xdp`, `packet`; `auto` takes the best that starts): the C data plane (native/dataplane.py)
  owns both interfaces, decapsulates, runs the role's stage (new and established flows), encapsulates and
  transmits in bursts. It punts what it cannot decide (ARP, hairpin, ICMP errors...) to the punt loop, which runs
  the same Python code as the socket path below and sends its answers back through the data plane. On the
  underlay, the instance itself answers ARP for its VTEP address and resolves the hypervisors' VTEPs.
* sockets (`python`, the reference of every role's semantics): tenant traffic arrives in VXLAN on a UDP socket
  bound to the VTEP address (the kernel decapsulates); the external side is an AF_PACKET socket.

Either way replies go back in VXLAN to the VTEP of the host holding the destination port, with the VPC's VNI and
router MAC, and on the external side the instance answers ARP for the addresses it serves and resolves its next
hops. The instance holds: the controller's client and the config watch (a delta per VPC section), the sections
(`sections`) and their forwarding view, the packet path and neighbours (`packets`, `neighbours`), the status file
and metrics. A change to one VPC's section is applied as that VPC's alone: to the role's policy, to the
forwarding view and to the data plane."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

from nfv_gateways.core import metrics
from nfv_gateways.core.edge import EdgeSpeaker, EdgeSpec
from nfv_gateways.core.frr import frr_available
from nfv_gateways.core.options import FASTPATHS, GatewayOptions
from nfv_gateways.core.packet import ip2int
from nfv_gateways.core.packets import PacketPath
from nfv_gateways.core.role import PacketStage, Role, role_class
from nfv_gateways.core.sections import Forwarding, VpcParts, sections_of, wire_parts
from nfv_gateways.core.underlay import mac_bytes
from nfv_gateways.native.dataplane import EXT, UL
from tianji.southbound import (
    GatewayConfig,
    GatewayConfigDelta,
    GatewayHeld,
    GatewaySection,
    apply_gateway_delta,
    vtep_interface,
)
from tianji.southbound_client import Answer, Southbound
from tianji.statusfile import write_atomic

log = logging.getLogger("tianji.gateway")
GARP_REPEAT_S = 1.2  # an announcement is repeated once (RFC 5227 sends two): one lost frame does not strand an address


class Instance:
    """One gateway instance running `role` (a name in core.role.ROLES, or a Role made by the caller)."""

    def __init__(self, o: GatewayOptions, role: str | Role, dataplane: Any = None) -> None:
        """`dataplane`: a native data plane built by the caller (tests); else chosen by --fastpath."""
        if o.fastpath not in FASTPATHS:
            raise SystemExit(f"--fastpath {o.fastpath}: choose one of {', '.join(FASTPATHS)}")
        self.o = o
        # standalone (--config-file): no controller to talk to
        self.api = Southbound(o.controller, o.token, tls=o.tls) if o.controller else None
        if self.api is not None:
            self.api.on_failover = lambda _url: self.write_status()
        self.vtep = str(vtep_interface(o.vtep_ip).ip)
        self.vtep_int = ip2int(self.vtep)
        self.counters: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.revision: int | None = None  # of the config applied
        self.eips: list[str] = []  # homed here (answered ARP for)
        self.parts: dict[str, VpcParts] = {}  # VPC id -> what its section contributes (applied)
        self.fwd = Forwarding()
        self.apply_ms: deque[float] = deque(maxlen=32)  # the last answers: received -> applied
        self.compile_ms: deque[float] = deque(maxlen=32)  # ... and the controller's time to make them
        self.garp_again: list[tuple[float, list[str]]] = []  # (when, addresses) to announce once more
        macs = o.macs or tuple(Path(f"/sys/class/net/{i}/address").read_text().strip()
                               for i in (o.underlay_if, o.external_if))
        self.mac = {UL: mac_bytes(macs[0]), EXT: mac_bytes(macs[1])}
        self.role: Role = role_class(role)(o, self.counters) if isinstance(role, str) else role
        self.dp = dataplane if dataplane is not None else self._native_dataplane()
        self.stage: PacketStage = self.role.attach(self.dp)
        if self.dp is None:
            self.fastpath = "python"
        elif dataplane is not None:
            self.fastpath = self.dp.backend
        elif label := getattr(self.role, "fastpath_label", None):  # what the role's stage does in C, if not all
            self.fastpath = f"{self.dp.backend} ({label})"
        else:
            self.fastpath = f"{self.dp.backend} (packet I/O, new and established flows in C)"
        self.packets = PacketPath(self.mac, self.vtep, self.vtep_int, self.fwd, self.dp, self.counters, self.lock)
        self.packets.stage = self.stage
        if getattr(self.role, "owns_external", False):  # the role serves the external side's punted frames
            self.packets.external = self.role.serve_external(self)  # type: ignore[attr-defined]
        self.neighbours = self.packets.neighbours
        self.edge: EdgeSpeaker | None = None
        self.edge_state: dict = {}
        self.edge_wake = threading.Event()  # a config applied: announce what changed now, not at the next pass
        if o.edge is not None:
            self._edge_routing(o.edge, macs[1])

    def _edge_routing(self, spec: EdgeSpec, mac: str) -> None:
        """Our addresses announced to the edge router, which is also the way off the external segment."""
        self.edge = EdgeSpeaker(self.o.name, spec, mac, self.o.state_dir / "edge")
        self.packets.speaker, self.packets.speaker_ip = self.edge, ip2int(spec.local_ip).to_bytes(4, "big")
        net = spec.subnet
        self.fwd.ext_net, self.fwd.ext_mask = int(net.network_address), int(net.netmask)
        self.fwd.ext_gw = ip2int(spec.peer)
        if self.dp is not None:
            self.dp.set_ext_route(int(net.network_address), net.prefixlen, self.fwd.ext_gw)

    def _native_dataplane(self) -> Any:
        """The native data plane for --fastpath (auto: the best backend that starts, saying why others did not);
        None when --fastpath names no native backend or auto found none."""
        from nfv_gateways.native.dataplane import BACKENDS, NativeDataPlane

        fp = self.o.fastpath
        best_first = getattr(self.role, "backends", BACKENDS)  # a role whose stage is best on another backend says so
        for backend in best_first if fp == "auto" else (fp,) if fp in BACKENDS else ():
            try:
                return NativeDataPlane(backend, self.o.name, self.o.underlay_if, self.o.external_if, self.mac[UL],
                                       self.mac[EXT], self.vtep_int, getattr(self.role, "cache_lru", 0))
            except Exception as e:  # auto goes on to the next backend, and says why
                if fp != "auto":
                    raise SystemExit(f"--fastpath {fp} does not work here: {e}") from e
                log.warning("fast path %s unavailable: %s", backend, e)
        if fp == "auto":
            log.warning("no native data plane started: using the Python path")
        return None

    # --- the config --------------------------------------------------------------------------------------------
    def parts_of(self, section: GatewaySection) -> VpcParts:
        return wire_parts(section.vpc, section.endpoints, self.role.policy_of(section))

    def apply(self, cfg: GatewayConfig) -> None:
        """Apply a whole config (a config file, tests): what differs from what is held, as apply_parts does."""
        self.apply_parts(cfg.revision, cfg.eips, cfg.vteps,
                         {v: self.parts_of(x) for v, x in sections_of(cfg, self.role.name).items()}, whole=True)

    def apply_sections(self, held: GatewayHeld, changed: set[str]) -> None:
        """Apply a delta's outcome: the sections of `changed` (a VPC whose section went is gone)."""
        parts = {v: self.parts_of(x) if (x := held.sections.get(v)) else None for v in changed}
        eips = sorted({a for x in held.sections.values() for a in x.eips})
        self.apply_parts(held.revision, eips, held.vteps, parts, whole=False)

    def apply_parts(self, revision: int, eips: list[str], vteps_cfg: list, new: dict[str, VpcParts | None],
                    whole: bool) -> None:
        """Apply what differs from what is held. `new`: VPC id -> its parts (None: gone); `whole`: `new` is every
        VPC (the others go). Each VPC that changed is applied alone: its policy to the role if that differs, its
        forwarding to the data plane if that differs; a gratuitous ARP goes for each address newly homed here."""
        first = self.revision is None
        parts = {} if whole else dict(self.parts)
        for vid, p in new.items():
            if p is None:
                parts.pop(vid, None)
            else:
                parts[vid] = p
        touched = {v for v in parts.keys() | self.parts.keys()
                   if parts.get(v) is not self.parts.get(v) and parts.get(v) != self.parts.get(v)}

        def differs(v: str, side: str) -> bool:
            p, q = parts.get(v), self.parts.get(v)
            return (getattr(p, side) if p else None) != (getattr(q, side) if q else None) or \
                (p.vni if p else None) != (q.vni if q else None)

        policy_touched = {v for v in touched if first or differs(v, "policy")}
        wire_touched = {v for v in touched if differs(v, "endpoints") or differs(v, "router_mac")}
        vteps = {v.ip for v in vteps_cfg}
        old_eips = set(self.eips)
        with self.lock:
            self.revision, self.eips = revision, eips
            if policy_touched:
                self.role.apply(parts, policy_touched, first)
            for v in touched:
                self.fwd.replace(self.parts.get(v), parts.get(v))
            if self.dp is not None:
                self._wire(parts, wire_touched, vteps)
            self.parts, self.fwd.vteps = parts, vteps
            self.fwd.served = {ip2int(e) for e in eips}
        self.counters["config_applies"] += 1
        if self.dp is not None:  # resolve the hypervisors' VTEPs before their first packet needs them
            for v in self.fwd.vteps - {self.vtep}:
                if ip2int(v) not in self.neighbours.arp[UL]:
                    self.neighbours.send_arp(UL, 1, self.vtep_int, ip2int(v), b"\0" * 6)
        new_eips = sorted(set(eips) - old_eips)
        log.info("config revision %d: %d VPCs (%d changed), %d EIPs (%d newly homed here), %d endpoints", revision,
                 len(parts), len(touched), len(eips), len(new_eips), len(self.fwd.endpoints))
        self.announce(new_eips)
        self.edge_wake.set()
        if new_eips:
            self.garp_again.append((time.monotonic() + GARP_REPEAT_S, new_eips))

    def _wire(self, parts: dict[str, VpcParts], touched: set[str], vteps: set[str]) -> None:
        """The data plane's forwarding of the VPCs whose endpoints or router MAC changed, each on its own."""
        for v in touched:
            old, new = self.parts.get(v), parts.get(v)
            if old is not None and (new is None or new.vni != old.vni):
                self.dp.remove_vpc(old.vni)
            if new is not None:
                self.dp.set_vpc(new.vni, new.router_mac, [(k[1], e.vtep_int, e.mac) for k, e in new.endpoints])
            self.counters["config_endpoint_applies"] += 1
        if vteps != self.fwd.vteps:
            self.dp.set_vteps([ip2int(v) for v in vteps])

    def announce(self, eips: list[str], repeat: bool = False) -> None:
        """Gratuitous ARP for addresses this instance homes (again after GARP_REPEAT_S: one lost frame does not
        strand an address)."""
        self.neighbours.announce([ip2int(e) for e in eips if not repeat or ip2int(e) in self.fwd.served])

    # --- control loops -----------------------------------------------------------------------------------------
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
        self.counters["whole_configs"] += d.base < 0
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

    def edge_tap_loop(self) -> None:
        """What the speaker's kernel sends (ARP, BGP, BFD), out on the external side."""
        assert self.edge is not None
        while self.edge.fd is not None:
            try:
                frame = self.edge.read()
            except OSError:
                return
            self.packets.tx(EXT, frame)

    def edge_loop(self) -> None:
        """Announce what we serve: the EIPs homed here and what the role serves beside them (the load balancer's
        VIP EIPs, served by every instance alike); read the session's state for the status."""
        assert self.edge is not None
        while self.edge.fd is not None:
            try:
                extra = getattr(self.role, "edge_addresses", lambda: set())()
                self.edge.announce(set(self.eips) | extra)
                self.edge_state = self.edge.peer_state()[0] | {"announced": sorted(self.edge.announced)}
            except Exception as e:  # the daemons restarting, vtysh timing out: the next pass retries
                self.counters["edge_errors"] += 1
                log.warning("edge routing: %s", e)
            self.edge_wake.wait(0.5)
            self.edge_wake.clear()

    def heartbeat_loop(self) -> None:
        """Beats as often as --beat-interval says, or else as each beat's answer asks (until the first: 0.1 s)."""
        every = self.o.beat_interval or 0.1
        while True:
            try:
                if not self.counters["registered"]:
                    self.api.register(self.o.name, self.vtep, "gateway", self.role.name)
                    self.counters["registered"] = 1
                answer = self.api.beat(self.o.name, {"ports": {}}, timeout=max(0.25, 3 * every)) or {}
                every = self.o.beat_interval or float(answer.get("beat_every") or every)
            except Exception as e:
                self.counters["registered"] = 0
                log.warning("heartbeat: %s", e)
            self.write_status()
            time.sleep(every)

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
            time.sleep(self.role.expiry_interval)
            self.expire(time.time())

    def expire(self, now: float) -> None:
        with self.lock:
            self.counters["expired"] += self.stage.expire(now)
            self.role.expire(now)

    # --- status --------------------------------------------------------------------------------------------------
    def status(self) -> dict:
        dp = self.dp
        return {"name": self.o.name, "role": self.role.name, "fastpath": self.fastpath, "revision": self.revision,
                "controller": self.api.current if self.api else None,
                "controller_failovers": self.api.failovers if self.api else 0,
                "eips": self.eips, "counters": dict(self.counters), "pid": os.getpid(), "updated": time.time(),
                "dataplane": dp.stats() if dp is not None else {},
                "dataplane_held": dp.held() if dp is not None else {},
                "dataplane_crossed": dict(dp.crossed) if dp is not None else {},
                "last_applies_ms": list(self.apply_ms), "last_compiles_ms": list(self.compile_ms),
                **({"edge": {"local": self.o.edge.local, "peer": self.o.edge.peer} | self.edge_state}
                   if self.o.edge else {})} \
            | self.role.status()

    def write_status(self) -> None:
        """The status file; a failure to make it is counted and logged, never the end of the loop that calls it
        (the heartbeat's: an instance that stops beating is failed over)."""
        try:
            write_atomic(self.o.state_dir / f"gateway-{self.o.name}.json", json.dumps(self.status(), indent=1))
        except Exception as e:
            self.counters["status_errors"] += 1
            log.warning("status file: %s", e)

    def metrics(self) -> bytes:
        return metrics.exposition(self)

    def run(self) -> None:
        owns = getattr(self.role, "owns_external", False)
        if self.dp is None:
            self.packets.open_sockets(None if owns else self.o.external_if)
        log.info("gateway %s (%s): VTEP %s on %s, external %s, fast path: %s", self.o.name, self.role.name,
                 self.vtep, self.o.underlay_if, self.o.external_if, self.fastpath)
        io = (self.packets.punt_loop,) if self.dp is not None else (self.packets.vxlan_loop, self.packets.ext_loop)
        if owns:
            io = (*io[:1], *self.role.loops(self))  # type: ignore[attr-defined]
        if self.dp is not None:
            self.dp.start(own_core=True)
        if self.edge is not None:
            if (why := frr_available()) is not None:
                raise SystemExit(f"--edge-local: {why}")
            self.edge.start()
            io = (*io, self.edge_tap_loop, self.edge_loop)
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
            for what, undo in (("data plane", self.dp.close if self.dp is not None else None),
                               ("role", getattr(self.role, "close", None)),
                               ("edge routing", self.edge.stop if self.edge is not None else None)):
                try:
                    if undo is not None:
                        undo()
                except Exception as e:  # one that fails must not leave the others' namespaces and programs behind
                    log.warning("stopping the %s: %s", what, e)
            log.info("gateway %s stopped", self.o.name)


__all__ = ["EXT", "UL", "GatewayOptions", "Instance"]
