"""The handoff: the NIC where customers' lines arrive as 802.1Q VLANs, tags pushed and popped here (this kernel has
no 8021q module, and the gateway must not depend on one).

A veth carries tagged frames intact, but the receiving kernel moves the tag into the packet's metadata: an
AF_PACKET socket reads the frame untagged and learns the tag from the PACKET_AUXDATA control message
(`tp_status & TP_STATUS_VLAN_VALID`, `tp_vlan_tci`), which is read here with every frame. A frame sent with its tag
in the bytes leaves tagged.

The customers' routers are neighbours per VLAN (two tenants' routers may have the same address on their own
VLANs): learned from their ARP, asked for with ARP from the line's address. An answer of ours to a packet (ICMP)
goes back to the MAC the packet came from."""

from __future__ import annotations

import logging
import socket
import struct
import subprocess
from collections import Counter
from collections.abc import Callable

from nfv_gateways.core.underlay import ETH_ARP, ETH_P_ALL, PACKET_OUTGOING

log = logging.getLogger("tianji.gateway")
SOL_PACKET, PACKET_AUXDATA = 263, 8
TP_STATUS_VLAN_VALID = 0x10
AUXDATA = struct.Struct("=IIIHHHH")  # tpacket_auxdata: status, len, snaplen, mac, net, vlan_tci, vlan_tpid
ETH_8021Q = 0x8100
BROADCAST = b"\xff" * 6


def untag(frame: bytes, ancdata: list) -> tuple[int | None, bytes]:
    """(VLAN, the frame without its tag) of a received frame: the tag from the auxiliary data, or still in the
    frame (a kernel that leaves it there); None: untagged."""
    for level, kind, data in ancdata:
        if level == SOL_PACKET and kind == PACKET_AUXDATA and len(data) >= AUXDATA.size:
            status, _, _, _, _, tci, _ = AUXDATA.unpack_from(data)
            if status & TP_STATUS_VLAN_VALID:
                return tci & 0xFFF, frame
    if len(frame) >= 18 and struct.unpack_from("!H", frame, 12)[0] == ETH_8021Q:
        return struct.unpack_from("!H", frame, 14)[0] & 0xFFF, frame[:12] + frame[16:]
    return None, frame


def tagged(vlan: int, dst: bytes, src: bytes, ethertype: int, payload: bytes) -> bytes:
    return dst + src + struct.pack("!HHH", ETH_8021Q, vlan & 0xFFF, ethertype) + payload


def arp_frame(op: int, sha: bytes, spa: int, tha: bytes, tpa: int) -> bytes:
    """An ARP packet (without its Ethernet header)."""
    return struct.pack("!HHBBH6sI6sI", 1, 0x0800, 6, 4, op, sha, spa, tha, tpa)


class Handoff:
    """The handoff on a socket of its own (the Python data path), or through the native data plane, which then owns
    the NIC: `tx` sends what this sends, and the frames punted from it come in through the role."""

    def __init__(self, ifname: str, mac: bytes, counters: Counter[str]) -> None:
        self.ifname, self.mac, self.counters = ifname, mac, counters
        self.neighbours: dict[tuple[int, int], bytes] = {}  # (VLAN, address) -> MAC
        self.sock: socket.socket | None = None
        self.tx: Callable[[bytes], bool] | None = None  # the data plane's, when it owns the NIC
        self.on_learn: Callable[[int, int, bytes], None] | None = None  # a router learned: (VLAN, address, MAC)

    def keep_tags(self) -> None:
        """Receive tags in the frames: a NIC (or veth) that strips them in hardware hides them from AF_XDP and
        DPDK, which have no metadata for them (AF_PACKET has: handoff.untag, io_packet.c). Before the data plane
        opens the NIC."""
        r = subprocess.run(["ethtool", "-K", self.ifname, "rxvlan", "off"], capture_output=True, text=True)
        if r.returncode and "Cannot change" not in r.stderr + r.stdout:
            log.warning("ethtool -K %s rxvlan off: %s (AF_XDP and DPDK may then see untagged frames)", self.ifname,
                        (r.stderr or r.stdout).strip())

    def open(self) -> None:
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        s.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        s.bind((self.ifname, 0))
        self.sock = s

    def receive(self) -> tuple[int | None, bytes] | None:
        """The next frame from the wire as (VLAN, untagged frame); None for our own transmissions."""
        assert self.sock is not None
        frame, anc, _, addr = self.sock.recvmsg(65535, socket.CMSG_SPACE(AUXDATA.size))
        if addr[2] == PACKET_OUTGOING:
            return None
        return untag(frame, anc)

    def send(self, vlan: int, dst: bytes, ethertype: int, payload: bytes) -> None:
        frame = tagged(vlan, dst, self.mac, ethertype, payload)
        if self.tx is not None:
            if not self.tx(frame):
                self.counters["drop_inject_full"] += 1
                return
        else:
            assert self.sock is not None
            self.sock.send(frame)
        self.counters["tx_handoff"] += 1

    def learn(self, vlan: int, frame: bytes) -> None:
        """A customer router's MAC, from its ARP (request or reply: the sender's). Not from its IP packets: those
        carry other hosts' addresses too, and the fast path never shows them all to Python."""
        if struct.unpack_from("!H", frame, 12)[0] != ETH_ARP or len(frame) < 42:
            return
        key, mac = (vlan, struct.unpack_from("!I", frame, 28)[0]), frame[22:28]
        if self.neighbours.get(key) != mac:
            self.neighbours[key] = mac
            if self.on_learn is not None:
                self.on_learn(vlan, key[1], mac)

    def send_ip(self, vlan: int, nexthop: int, src: int, pkt: bytes) -> bool:
        """An IPv4 packet to `nexthop` on `vlan`; False (and an ARP request from `src`) while its MAC is unknown."""
        mac = self.neighbours.get((vlan, nexthop))
        if mac is None:
            self.counters["drop_unresolved"] += 1
            self.send(vlan, BROADCAST, ETH_ARP, arp_frame(1, self.mac, src, b"\0" * 6, nexthop))
            return False
        self.send(vlan, mac, 0x0800, pkt)
        return True


__all__ = ["BROADCAST", "ETH_8021Q", "Handoff", "arp_frame", "tagged", "untag"]
