"""Moving an instance's packets, the same for every role: the native data plane's punt/inject slow path or the
socket path, VXLAN decapsulation and encapsulation. The role's stage decides where each packet goes; this moves
it there, through the forwarding view (`sections.Forwarding`) and the neighbours."""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from nfv_gateways.core.neighbours import Neighbours
from nfv_gateways.core.packet import Verdict
from nfv_gateways.core.role import PacketStage
from nfv_gateways.core.sections import Forwarding
from nfv_gateways.core.underlay import ETH_ARP, ETH_IP, ETH_P_ALL, PACKET_OUTGOING, VXLAN_PORT, vxlan_ip_udp
from nfv_gateways.native.dataplane import EXT, PUNT_TRANSLATED, UL
from tianji.inet import checksum

log = logging.getLogger("tianji.gateway")


class PacketPath:
    def __init__(self, mac: dict[int, bytes], vtep: str, vtep_int: int, fwd: Forwarding, dp: Any,
                 counters: Counter[str], lock: threading.Lock) -> None:
        self.mac, self.vtep, self.vtep_int, self.fwd, self.dp = mac, vtep, vtep_int, fwd, dp
        self.counters, self.lock = counters, lock
        self.stage: PacketStage | None = None  # the role's, once attached
        self.external: Callable[[bytes], None] | None = None  # a role that owns the external side: its frames
        self.speaker: Any = None  # the edge router's BGP speaker (core.edge): frames to its address go to it
        self.speaker_ip = b""
        self.neighbours = Neighbours(mac, vtep_int, fwd, self.tx, dp, counters)
        self.vx: socket.socket | None = None
        self.ext: socket.socket | None = None

    # --- moving packets --------------------------------------------------------------------------------------
    def open_sockets(self, external_if: str | None) -> None:
        """The socket path (no native data plane): VXLAN on a UDP socket at the VTEP (the kernel decapsulates),
        the external side on an AF_PACKET socket (None: the role serves it)."""
        self.vx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.vx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.vx.bind((self.vtep, VXLAN_PORT))
        if external_if is None:
            return
        self.ext = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.ext.bind((external_if, 0))

    def tx(self, port: int, frame: bytes) -> None:
        if self.dp is not None:
            if not self.dp.inject(port, frame):
                self.counters["drop_inject_full"] += 1
        elif port == EXT:
            assert self.ext is not None
            self.ext.send(frame)
        else:  # socket mode: the kernel encapsulates nothing for us; VXLAN goes out via self.vx in to_tenant
            raise ValueError("underlay frames are sent by the kernel in socket mode")

    def punt_loop(self) -> None:
        """What the native data plane did not decide: ARP, hairpin, ICMP errors, unknown neighbours, flows with no
        rule or port."""
        assert self.stage is not None
        while True:
            for port, frame in self.dp.punt(100):
                self.handle_punt(port, frame)

    def handle_punt(self, port: int, frame: bytes) -> None:
        try:
            if port == UL:
                self.from_underlay(frame)
            elif port == EXT:
                (self.external or self.from_external)(frame)
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
            if port == EXT and self.speaker is not None and frame[38:42] == self.speaker_ip:
                self.speaker.write(frame)  # its kernel answers, or takes the answer
            self.neighbours.on_arp(port, frame)
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
        assert self.vx is not None
        while True:
            data, (src, _port) = self.vx.recvfrom(65535)
            try:
                self.from_tenant(data, src)
            except Exception as e:  # a malformed packet never takes the gateway down
                self.counters["drop_error"] += 1
                log.debug("tenant packet: %s", e)

    def from_tenant(self, data: bytes, src: str) -> None:
        if src not in self.fwd.vteps:
            self.counters["drop_unknown_vtep"] += 1
            return
        if len(data) < 8 + 14 + 20 or data[0] & 0x08 == 0:
            self.counters["drop_malformed"] += 1
            return
        vni = int.from_bytes(data[4:7], "big")
        if vni not in self.fwd.router_mac:
            self.counters["drop_unknown_vni"] += 1
            return
        if struct.unpack_from("!H", data, 8 + 12)[0] != ETH_IP:
            self.counters["drop_not_ipv4"] += 1
            return
        buf = bytearray(data[8 + 14:])
        assert self.stage is not None
        with self.lock:
            v = self.stage.outbound(vni, buf, time.time())
        if v is None:
            self.counters["drop_nat"] += 1
        elif v.direction != "held":
            self.deliver(v, buf)

    def ext_loop(self) -> None:
        assert self.ext is not None
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
        if self.speaker is not None and ip[16:20] == self.speaker_ip:
            self.speaker.write(frame)  # BGP, BFD, ping: the speaker's
            return
        buf = bytearray(ip)
        assert self.stage is not None
        with self.lock:
            v = self.stage.inbound(buf, time.time())
        if v is None:
            self.counters["drop_nat_in"] += 1
            return
        if v.direction != "held":
            self.deliver(v, buf)

    def deliver(self, v: Verdict, buf: bytearray) -> None:
        """Where the stage said: out to the internet (a translated packet, or an ICMP error the gateway answers
        with), or into a VPC, whole or as the fragments that fit the VPC's MTU."""
        if v.direction == "out":
            for pkt in v.fragments or (bytes(buf),):
                self.to_external(pkt)
            return
        for pkt in v.fragments or (bytes(buf),):
            self.to_tenant(v.vni, v.ip, pkt)

    def to_external(self, pkt: bytes) -> None:
        # on-link on the external segment, or (with an edge router) through it
        spa = int.from_bytes(self.speaker_ip, "big") if self.speaker_ip else next(iter(self.fwd.served), 0)
        self.neighbours.resolve_and_send(EXT, self.fwd.ext_hop(int.from_bytes(pkt[16:20], "big")), pkt, spa)

    def to_tenant(self, vni: int, ip: int, pkt: bytes) -> None:
        ep = self.fwd.endpoints.get((vni, ip))
        if ep is None or vni not in self.fwd.router_mac:
            self.counters["drop_no_endpoint"] += 1
            return
        inner = ep.mac + self.fwd.router_mac[vni] + struct.pack("!H", ETH_IP) + pkt
        vx = b"\x08\0\0\0" + vni.to_bytes(3, "big") + b"\0" + inner
        if self.dp is None:
            assert self.vx is not None
            self.vx.sendto(vx, (ep.vtep, VXLAN_PORT))
            self.counters["tx_tenant"] += 1
            return
        self.neighbours.resolve_and_send(UL, ep.vtep_int, vxlan_ip_udp(self.vtep_int, ep.vtep_int, pkt, vx),
                                         self.vtep_int)


__all__ = ["PacketPath"]
