"""A NAT gateway instance: a VTEP on the underlay, an Ethernet port on the external segment, NAT in between.

Two ways to move packets, chosen by `--fastpath`:

* native (`dpdk`, `xdp`, `packet`; `auto` takes the best that starts): the C data plane (dataplane.py, gw_dp.c)
  owns both interfaces, decapsulates, translates established flows, encapsulates and transmits in bursts. It punts
  what it cannot decide (ARP, new flows, ICMP errors, hairpin, DNAT...) to `punt_loop`, which runs the same Python
  code as the socket path below and sends its answers back through the data plane. On the underlay, the instance
  itself answers ARP for its VTEP address and resolves the hypervisors' VTEPs.
* sockets (`c`, `python`): tenant traffic arrives in VXLAN on a UDP socket bound to the VTEP address (the kernel
  decapsulates); the external side is an AF_PACKET socket. `c` translates established flows in C, one ctypes call
  per packet; `python` is the reference.

Either way replies go back in VXLAN to the VTEP of the host holding the destination port, with the VPC's VNI and
router MAC, and on the external side the instance answers ARP for the EIPs it serves and resolves its next hops.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import signal
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from controller.hostconfig import GatewayConfig
from controller.statusfile import write_atomic
from nfv_gateways.dataplane import EXT, PUNT_TRANSLATED, UL
from nfv_gateways.nat import NatConfig, NatTable, SnatRule, ip2int
from nfv_gateways.packet import PROTO_TCP, PROTO_UDP, csum

log = logging.getLogger("tianji.gateway")
ETH_P_ALL, ETH_IP, ETH_ARP = 0x0003, 0x0800, 0x0806
PACKET_OUTGOING = 4
VXLAN_PORT = 4789
PROTO = {"tcp": PROTO_TCP, "udp": PROTO_UDP}
FASTPATHS = ("auto", "dpdk", "xdp", "packet", "c", "python")
BCAST = b"\xff" * 6


def mac_bytes(mac: str) -> bytes:
    return bytes.fromhex(mac.replace(":", ""))


def mix64(x: int) -> int:
    """gw_dp.c's mix(): the 64-bit finaliser of MurmurHash3, truncated to 32 bits."""
    m = (1 << 64) - 1
    x ^= x >> 33
    x = x * 0xFF51AFD7ED558CCD & m
    x ^= x >> 33
    x = x * 0xC4CEB9FE1A85EC53 & m
    x ^= x >> 33
    return x & 0xFFFFFFFF


def vxlan_ip_udp(src: int, dst: int, inner_ip: bytes, vxlan: bytes) -> bytes:
    """Outer IPv4 + UDP for a VXLAN payload, as the C data plane writes it (source port from the inner flow)."""
    a, b = int.from_bytes(inner_ip[12:16], "big"), int.from_bytes(inner_ip[16:20], "big")
    sport = 49152 | (mix64(a ^ b ^ inner_ip[9] << 32) & 0x3FFF)
    udp = struct.pack("!HHHH", sport, VXLAN_PORT, 8 + len(vxlan), 0)
    hdr = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28 + len(vxlan), 0, 0x4000, 64, 17, 0,
                                src.to_bytes(4, "big"), dst.to_bytes(4, "big")))
    hdr[10:12] = csum(bytes(hdr)).to_bytes(2, "big")
    return bytes(hdr) + udp + vxlan


def nat_config(cfg: GatewayConfig) -> NatConfig:
    snat = tuple(SnatRule(v.vni, r.cidr, tuple(ip2int(e) for e in r.eips)) for v in cfg.vpcs for r in v.snat if r.eips)
    static = tuple((x.vni, ip2int(x.ip), ip2int(x.eip)) for x in cfg.static)
    dnat = tuple((ip2int(d.eip), PROTO[d.protocol], d.external_port, d.vni, ip2int(d.ip), d.internal_port)
                 for d in cfg.dnat)
    return NatConfig(snat=snat, static=static, dnat=dnat)


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


class Gateway:
    def __init__(self, o: GatewayOptions, dataplane: object = None) -> None:
        self.o = o
        self.vtep = str(ipaddress.IPv4Interface(o.vtep_ip if "/" in o.vtep_ip else f"{o.vtep_ip}/24").ip)
        self.cfg: GatewayConfig | None = None
        self.counters: Counter[str] = Counter()
        self.endpoints: dict[tuple[int, int], tuple[str, bytes]] = {}
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
        if dataplane is not None:
            self.table, self.fastpath = dataplane.nat, dataplane.backend
        else:
            self.table, self.fastpath = self._make_table(NatConfig())

    def _make_table(self, config: NatConfig):  # noqa: ANN202
        fp = self.o.fastpath
        if fp not in FASTPATHS:
            raise SystemExit(f"--fastpath {fp}: choose one of {', '.join(FASTPATHS)}")
        from nfv_gateways.dataplane import BACKENDS, NativeDataPlane

        for backend in BACKENDS if fp == "auto" else (fp,) if fp in BACKENDS else ():
            try:
                self.dp = NativeDataPlane(backend, self.o.name, self.o.underlay_if, self.o.external_if,
                                          self.mac[UL], self.mac[EXT], self.vtep_int, config)
                return self.dp.nat, f"{backend} (packet I/O and established flows in C, new flows in Python)"
            except Exception as e:  # noqa: BLE001 - auto goes on to the next backend, and says why
                if fp != "auto":
                    raise SystemExit(f"--fastpath {fp} does not work here: {e}") from e
                log.warning("fast path %s unavailable: %s", backend, e)
        if fp in ("auto", "c"):
            try:
                from nfv_gateways.fastpath import FastNat

                return FastNat(config), "c (sockets; established flows in C, new flows in Python)"
            except Exception as e:  # noqa: BLE001
                if fp == "c":
                    raise
                log.warning("native fast path unavailable (%s): using the Python path", e)
        return NatTable(config), "python"

    # --- controller --------------------------------------------------------------------------------------------
    def api(self, method: str, path: str, body: object = None, timeout: float = 10) -> tuple[int, object]:
        req = urllib.request.Request(self.o.controller.rstrip("/") + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"Bearer {self.o.token}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
                return r.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            if e.code == 304:
                return 304, None
            raise

    def apply(self, cfg: GatewayConfig) -> None:
        with self.lock:
            self.cfg = cfg
            self.table.update_config(nat_config(cfg))
            self.endpoints = {(e.vni, ip2int(e.ip)): (e.vtep_ip, mac_bytes(e.mac)) for e in cfg.endpoints}
            self.router_mac = {v.vni: mac_bytes(v.router_mac) for v in cfg.vpcs}
            self.vteps = {v.ip for v in cfg.vteps}
            self.served = {ip2int(e) for e in cfg.eips}
            if self.dp is not None:
                self.dp.set_config([ip2int(v) for v in self.vteps], self.router_mac,
                                   {k: (ip2int(v[0]), v[1]) for k, v in self.endpoints.items()})
        if self.dp is not None:  # resolve the hypervisors' VTEPs before their first packet needs them
            for v in self.vteps - {self.vtep}:
                if ip2int(v) not in self.arp[UL]:
                    self.send_arp(UL, 1, self.vtep_int, ip2int(v), b"\0" * 6)
        log.info("config revision %d: %d VPCs, %d EIPs, %d endpoints", cfg.revision, len(cfg.vpcs), len(cfg.eips),
                 len(cfg.endpoints))
        for eip in cfg.eips:  # gratuitous ARP: the external segment learns where the EIPs live now
            self.send_arp(EXT, 2, ip2int(eip), ip2int(eip), BCAST)

    def watch_loop(self) -> None:
        after = -1
        while True:
            try:
                code, body = self.api("GET", f"/v1/gateways/{self.o.name}/config?after={after}&timeout=25", timeout=40)
                if code == 200:
                    cfg = GatewayConfig.model_validate(body)
                    after = cfg.revision
                    self.apply(cfg)
            except Exception as e:  # noqa: BLE001 - keep serving with the last config through controller outages
                self.counters["watch_errors"] += 1
                log.warning("watch: %s", e)
                time.sleep(1)

    def heartbeat_loop(self) -> None:
        while True:
            try:
                if not self.counters["registered"]:
                    self.api("POST", "/v1/hosts", {"name": self.o.name, "vtep_ip": self.vtep, "kind": "gateway"})
                    self.counters["registered"] = 1
                self.api("POST", f"/v1/hosts/{self.o.name}/status", {"ports": {}})
            except Exception as e:  # noqa: BLE001
                self.counters["registered"] = 0
                log.warning("heartbeat: %s", e)
            self.write_status()
            time.sleep(0.5)  # the controller moves this instance's EIPs after 2 s of silence

    def status_loop(self) -> None:
        while True:
            self.write_status()
            time.sleep(0.5)

    def expiry_loop(self) -> None:
        while True:
            time.sleep(5)
            with self.lock:
                self.counters["expired"] += self.table.expire(time.time())

    # --- data plane --------------------------------------------------------------------------------------------
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
        except Exception as e:  # noqa: BLE001 - a malformed packet never takes the gateway down
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
        if struct.unpack_from("!H", ip, 6)[0] & 0x3FFF or csum(ip[:20]) != 0:
            self.counters["drop_malformed"] += 1  # outer fragments (the underlay MTU carries VXLAN whole) or bad sums
            return
        self.from_tenant(ip[28:], socket.inet_ntoa(ip[12:16]))

    def vxlan_loop(self) -> None:
        while True:
            data, (src, _port) = self.vx.recvfrom(65535)
            try:
                self.from_tenant(data, src)
            except Exception as e:  # noqa: BLE001 - a malformed packet never takes the gateway down
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
        elif v.direction == "out":
            self.to_external(bytes(buf))
        else:
            self.to_tenant(v.vni, v.ip, bytes(buf))

    def ext_loop(self) -> None:
        while True:
            frame, addr = self.ext.recvfrom(65535)
            if addr[2] == PACKET_OUTGOING:
                continue
            try:
                self.from_external(frame)
            except Exception as e:  # noqa: BLE001
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
        self.to_tenant(v.vni, v.ip, bytes(buf))

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
        vtep, mac = ep
        inner = mac + self.router_mac[vni] + struct.pack("!H", ETH_IP) + pkt
        vx = b"\x08\0\0\0" + vni.to_bytes(3, "big") + b"\0" + inner
        if self.dp is None:
            self.vx.sendto(vx, (vtep, VXLAN_PORT))
            self.counters["tx_tenant"] += 1
            return
        self.resolve_and_send(UL, ip2int(vtep), vxlan_ip_udp(self.vtep_int, ip2int(vtep), pkt, vx), self.vtep_int)

    # --- status ------------------------------------------------------------------------------------------------
    def status(self) -> dict:
        nat = self.table.counters
        return {"name": self.o.name, "fastpath": self.fastpath, "revision": self.cfg.revision if self.cfg else None,
                "eips": self.cfg.eips if self.cfg else [], "mappings": len(getattr(self.table, "ref", self.table)
                                                                              .by_inside),
                "counters": dict(self.counters), "nat": dict(nat), "pid": os.getpid(), "updated": time.time(),
                "dataplane": self.dp.stats() if self.dp is not None else {}}

    def write_status(self) -> None:
        write_atomic(self.o.state_dir / f"gateway-{self.o.name}.json", json.dumps(self.status(), indent=1))

    def metrics(self) -> str:
        """Prometheus text exposition of the counters and table sizes."""
        st = self.status()
        lines = ["# TYPE tianji_gateway_mappings gauge", f'tianji_gateway_mappings{{gateway="{self.o.name}"}} '
                 f'{st["mappings"]}', "# TYPE tianji_gateway_eips gauge",
                 f'tianji_gateway_eips{{gateway="{self.o.name}"}} {len(st["eips"])}',
                 "# TYPE tianji_gateway_packets_total counter"]
        for k, v in sorted(st["counters"].items()):
            lines.append(f'tianji_gateway_packets_total{{gateway="{self.o.name}",counter="{k}"}} {v}')
        lines.append("# TYPE tianji_gateway_nat_total counter")
        for k, v in sorted(st["nat"].items()):
            lines.append(f'tianji_gateway_nat_total{{gateway="{self.o.name}",counter="{k}"}} {v}')
        if hasattr(self.table, "stats"):
            lines.append("# TYPE tianji_gateway_fastpath_total counter")
            for k, v in self.table.stats().items():
                lines.append(f'tianji_gateway_fastpath_total{{gateway="{self.o.name}",counter="{k}"}} {v}')
        if st["dataplane"]:
            lines.append("# TYPE tianji_gateway_dataplane_total counter")
            for k, v in st["dataplane"].items():
                lines.append(f'tianji_gateway_dataplane_total{{gateway="{self.o.name}",counter="{k}"}} {v}')
        return "\n".join(lines) + "\n"

    def serve_metrics(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        gw = self

        class Metrics(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's API
                body = gw.metrics().encode()
                self.send_response(200 if self.path in ("/metrics", "/") else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_a: object) -> None:
                pass

        ThreadingHTTPServer(("127.0.0.1", self.o.metrics_port), Metrics).serve_forever()

    def run(self) -> None:
        self.open_sockets()
        log.info("gateway %s: VTEP %s on %s, external %s, fast path: %s", self.o.name, self.vtep, self.o.underlay_if,
                 self.o.external_if, self.fastpath)
        io = (self.punt_loop,) if self.dp is not None else (self.vxlan_loop, self.ext_loop)
        if self.dp is not None:
            self.dp.start()
        control: tuple = (self.heartbeat_loop, self.watch_loop)
        if self.o.config_file is not None:
            self.apply(GatewayConfig.model_validate_json(self.o.config_file.read_text()))
            control = (self.status_loop,)
        for fn in (*control, *io, self.expiry_loop, self.serve_metrics):
            threading.Thread(target=fn, name=fn.__name__, daemon=True).start()
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_a: stop.set())
        try:
            stop.wait()
        finally:  # detach XDP programs and nftables rules: left behind, they would eat the next instance's traffic
            if self.dp is not None:
                self.dp.close()
            log.info("gateway %s stopped", self.o.name)
