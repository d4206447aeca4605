"""The NAT's FlowStore over the C table (include/tj_nat.h): store.py states the rules, native/nat_flows.c keeps
them. A lookup copies one `tj_nat_mapping_t` out; a write copies one in (C merges: never back)."""

from __future__ import annotations

import ctypes
from collections import Counter

from nfv_gateways.native.api import constants, structure
from nfv_gateways.roles.nat.policy import NatSettings
from nfv_gateways.roles.nat.store import TCP_PORT_HOLD, Mapping

LIST_CHUNK = 4096


class CStore:
    """The FlowStore over the C table at handle `h` of `lib`; `crossed` counts its lookups and writes."""

    def __init__(self, lib: ctypes.CDLL, h: int, crossed: Counter[str]) -> None:
        self.lib, self.h, self.crossed = lib, h, crossed
        self.rec = structure("tj_nat_mapping_t")
        self._one = self.rec()
        k = constants(lib)
        self._max_peers, self._exists = k["NAT_MAX_PEERS"], k["NAT_EXISTS"]

    def configure(self, s: NatSettings) -> None:
        self.lib.nat_set_ports(self.h, s.port_lo, s.port_hi)
        self.lib.nat_set_mtu(self.h, s.mtu)
        self.lib.nat_set_external_mtu(self.h, s.external_mtu)
        t = s.timeouts
        self.lib.nat_set_timeouts(self.h, t.udp, t.tcp_established, t.tcp_transitory, t.icmp, TCP_PORT_HOLD)

    def _mapping(self, r: ctypes.Structure) -> Mapping:
        return Mapping(r.vni, r.ip, r.port, r.proto, r.eip, r.eport, r.last,
                       [(r.peer_ip[i], r.peer_port[i]) for i in range(r.npeers)], bool(r.established),
                       bool(r.closing))

    def _record(self, m: Mapping) -> ctypes.Structure:
        r, peers = self._one, m.peers[-self._max_peers:]
        r.vni, r.ip, r.port, r.proto, r.eip, r.eport, r.last = m.vni, m.ip, m.port, m.proto, m.eip, m.eport, m.last
        r.established, r.closing, r.npeers = int(m.tcp_established), int(m.tcp_closing), len(peers)
        for i, (pip, pport) in enumerate(peers):
            r.peer_ip[i], r.peer_port[i] = pip, pport
        return r

    def find_in(self, vni: int, ip: int, port: int, proto: int) -> Mapping | None:
        self.crossed["lookups"] += 1
        r = self._one
        return self._mapping(r) if self.lib.nat_get_in(self.h, vni, ip, port, proto, ctypes.byref(r)) == 0 else None

    def find_out(self, eip: int, eport: int, proto: int) -> Mapping | None:
        self.crossed["lookups"] += 1
        r = self._one
        return self._mapping(r) if self.lib.nat_get_out(self.h, eip, eport, proto, ctypes.byref(r)) == 0 else None

    def create(self, m: Mapping, now: float) -> Mapping | int:
        self.crossed["writes"] += 1
        r = self._record(m)
        got = self.lib.nat_create_mapping(self.h, ctypes.byref(r), now)
        return self._mapping(r) if got in (0, self._exists) else got

    def put(self, m: Mapping) -> None:
        self.crossed["writes"] += 1
        self.lib.nat_put(self.h, ctypes.byref(self._record(m)))

    def delete(self, m: Mapping, hold_until: float = 0.0) -> None:
        self.crossed["writes"] += 1
        self.lib.nat_del(self.h, m.vni, m.ip, m.port, m.proto, hold_until)

    def mappings(self, vni: int | None = None) -> list[Mapping]:
        out, buf, cursor = [], (self.rec * LIST_CHUNK)(), ctypes.c_uint32(0)
        while True:
            n = self.lib.nat_list(self.h, vni or 0, int(vni is None), buf, LIST_CHUNK, ctypes.byref(cursor))
            out += [self._mapping(buf[i]) for i in range(n)]
            if n < LIST_CHUNK:
                return out

    def expire(self, now: float) -> int:
        return self.lib.nat_expire(self.h, now)

    def __len__(self) -> int:
        return self.lib.nat_count(self.h)


__all__ = ["CStore"]
