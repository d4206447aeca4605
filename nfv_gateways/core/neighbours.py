"""Neighbours on both sides of an instance (ARP): learn senders, answer for our addresses (the EIPs it homes
outside, its VTEP inside), resolve next hops with packets waiting (64 at most per next hop)."""

from __future__ import annotations

import struct
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from nfv_gateways.core.sections import Forwarding
from nfv_gateways.core.underlay import BCAST, ETH_ARP, ETH_IP
from nfv_gateways.native.dataplane import EXT, UL


class Neighbours:
    def __init__(self, mac: dict[int, bytes], vtep_int: int, fwd: Forwarding, tx: Callable[[int, bytes], None],
                 dp: Any, counters: Counter[str]) -> None:
        self.mac, self.vtep_int, self.fwd, self.tx, self.dp, self.counters = mac, vtep_int, fwd, tx, dp, counters
        self.arp: dict[int, dict[int, bytes]] = {UL: {}, EXT: {}}
        self.pending: dict[int, dict[int, list[bytes]]] = {UL: defaultdict(list), EXT: defaultdict(list)}

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
        ours = tpa in self.fwd.served if port == EXT else tpa == self.vtep_int
        if op == 1 and ours:
            self.send_arp(port, 2, tpa, spa, sha)

    def send_arp(self, port: int, op: int, spa: int, tpa: int, tha: bytes) -> None:
        dst = tha if op == 2 and tha != BCAST else BCAST
        body = struct.pack("!HHBBH6s4s6s4s", 1, ETH_IP, 6, 4, op, self.mac[port], spa.to_bytes(4, "big"),
                           tha if op == 2 else b"\0" * 6, tpa.to_bytes(4, "big"))
        self.tx(port, dst + self.mac[port] + struct.pack("!H", ETH_ARP) + body)

    def resolve_and_send(self, port: int, nexthop: int, pkt: bytes, spa: int) -> None:
        """Send an IPv4 packet to an on-link next hop, resolving its MAC first when needed."""
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

    def announce(self, eips: list[int]) -> None:
        """Gratuitous ARP for addresses this instance homes: the external segment learns that they live here now.
        The request form (RFC 5227 announcement, as `arping -U` sends): Linux overrides an entry with it at once,
        while a broadcast reply whose target MAC is not the sender's counts as gratuitous only after the locktime."""
        for eip in eips:
            self.send_arp(EXT, 1, eip, eip, b"\0" * 6)
            self.counters["gratuitous_arps"] += 1


__all__ = ["Neighbours"]
