"""The native NAT stage (native/nat_stage.c, include/tj_nat.h) behind ctypes, the Python reference its slow path.

`FastNat` has NatTable's interface. Established mappings are translated in C (TCP handshake and teardown
included: C keeps the established/closing bits, merged back here); on a miss (new flow, new peer, static EIP,
DNAT, ICMP error, hairpin, anything malformed) the packet goes to the Python reference, which
decides exactly as it would alone, and the resulting mapping is pushed into the C table. New flows therefore cost
one Python call each (tens of microseconds); established ones never reach Python.

The library is compiled on the target machine by native/Makefile (run by `make setup`, or on first load).
"""

from __future__ import annotations

import ctypes
from collections import Counter

from nfv_gateways.nat import NatTable, Verdict
from nfv_gateways.nat_config import NatConfig
from nfv_gateways.native_api import FastPathUnavailable, constants
from nfv_gateways.native_api import load as load_library
from nfv_gateways.packet import PROTO_ICMP, l4_ports, parse_ip4

LIB = "_nat_fp.so"  # the NAT stage alone (native/Makefile); every data-plane library carries it too


def carray(ctype: type, values: list[int]) -> ctypes.Array:
    """A C array of these values (never empty: C gets a valid pointer and the count says how many count)."""
    return (ctype * max(len(values), 1))(*values)


def load() -> ctypes.CDLL:
    return load_library(LIB)


class FastNat:
    """NatTable's interface; C for established flows, the Python reference for everything else."""

    def __init__(self, config: NatConfig, capacity_pow2: int = 1 << 16, lib: ctypes.CDLL | None = None) -> None:
        self.lib = lib if lib is not None else load()
        k = constants(self.lib)
        self._out, self._in, self._max_peers = k["NAT_OUT"], k["NAT_IN"], k["NAT_MAX_PEERS"]
        self.h = self.lib.nat_create(capacity_pow2)
        if not self.h:
            raise FastPathUnavailable("nat_create failed (out of memory?)")
        self.ref = NatTable(config)
        self._push_config()

    def close(self) -> None:
        if self.h:
            self.lib.nat_destroy(self.h)
            self.h = None

    def __del__(self) -> None:
        self.close()

    @property
    def counters(self) -> Counter[str]:
        """The reference's counters plus the packets the fast path translated on its own."""
        c = Counter(self.ref.counters)
        st = self.stats()
        c["out"] += st["fast_out"]
        c["in"] += st["fast_in"]
        return +c

    def _push_config(self) -> None:
        served = sorted(self.ref.served)
        self.lib.nat_set_served(self.h, carray(ctypes.c_uint32, served), len(served))
        self.lib.nat_set_mtu(self.h, self.ref.config.mtu)
        self.lib.nat_set_external_mtu(self.h, self.ref.config.external_mtu)
        vm = [(vni, mtu) for vni, mtu in self.ref.config.vpc_mtus if mtu != self.ref.config.mtu]
        if self.lib.nat_set_vpc_mtus(self.h, carray(ctypes.c_uint32, [v for v, _ in vm]),
                                     carray(ctypes.c_uint32, [m for _, m in vm]), len(vm)) != 0:
            raise FastPathUnavailable("nat_set_vpc_mtus failed (out of memory)")
        st = self.ref.config.static
        dn = self.ref.config.dnat  # (eip, proto, ext port, vni, ip, port)
        u32, u16, u8 = ctypes.c_uint32, ctypes.c_uint16, ctypes.c_uint8
        r = self.lib.nat_set_rules(self.h, carray(u32, [s[0] for s in st]), carray(u32, [s[1] for s in st]),
                                   carray(u32, [s[2] for s in st]), len(st), carray(u32, [d[0] for d in dn]),
                                   carray(u16, [d[2] for d in dn]), carray(u8, [d[1] for d in dn]),
                                   carray(u32, [d[3] for d in dn]), carray(u32, [d[4] for d in dn]),
                                   carray(u16, [d[5] for d in dn]), len(dn))
        if r != 0:
            raise FastPathUnavailable("nat_set_rules failed (out of memory)")

    def update_config(self, config: NatConfig) -> list[tuple[int, int, int, int]]:
        gone = self.ref.update_config(config)
        for key in gone:
            self.lib.nat_del(self.h, *key)
        self._push_config()
        return gone

    def _push(self, key: tuple[int, int, int, int]) -> None:
        m = self.ref.by_inside.get(key)
        if m is None:
            return
        peers = sorted(m.peers)[:self._max_peers]
        ips = (ctypes.c_uint32 * self._max_peers)(*[p[0] for p in peers])
        ports = (ctypes.c_uint16 * self._max_peers)(*[p[1] for p in peers])
        self.lib.nat_put(self.h, m.vni, m.ip, m.port, m.proto, m.eip, m.eport, int(m.tcp_established),
                         int(m.tcp_closing), ips, ports, len(peers), m.last)

    def sync(self) -> None:
        """Pull the last-seen times the fast path kept back into the reference (before expiry, for stats)."""
        for key in self.ref.by_inside:
            self.sync_one(key)

    def expire(self, now: float) -> int:
        self.sync()
        before = set(self.ref.by_inside)
        n = self.ref.expire(now)
        for key in before - set(self.ref.by_inside):
            self.lib.nat_del(self.h, *key)
        return n

    def outbound(self, vni: int, buf: bytearray, now: float) -> Verdict | None:
        raw = (ctypes.c_char * len(buf)).from_buffer(buf)
        done = self.lib.nat_outbound(self.h, vni, raw, len(buf), now) == self._out
        del raw  # the reference may replace the packet (time exceeded): no view of it may outlive the call
        if done:
            return Verdict("out")
        key = _inside_key(vni, buf)
        self.sync_one(key)
        v = self.ref.outbound(vni, buf, now)
        if key is not None:
            self._push(key)
        return v

    def inbound(self, buf: bytearray, now: float) -> Verdict | None:
        raw = (ctypes.c_char * len(buf)).from_buffer(buf)
        vni, ip = ctypes.c_uint32(), ctypes.c_uint32()
        done = self.lib.nat_inbound(self.h, raw, len(buf), now, ctypes.byref(vni), ctypes.byref(ip)) == self._in
        del raw
        if done:
            return Verdict("in", vni.value, ip.value)
        key = _outside_key(buf)
        m = self.ref.by_outside.get(key) if key else None
        if m is not None:
            self.sync_one((m.vni, m.ip, m.port, m.proto))
        v = self.ref.inbound(buf, now)
        if m is not None:
            self._push((m.vni, m.ip, m.port, m.proto))
        return v

    def sync_one(self, key: tuple[int, int, int, int] | None) -> None:
        """Merge what the fast path saw into the reference: last-seen time, TCP established/closing (monotonic)."""
        if key is not None and (m := self.ref.by_inside.get(key)) is not None:
            bits = ctypes.c_uint8()
            last = self.lib.nat_state(self.h, *key, ctypes.byref(bits))
            if last > m.last:
                m.last = last
            if last >= 0:
                m.tcp_established |= bool(bits.value & 1)
                m.tcp_closing |= bool(bits.value & 2)

    def stats(self) -> dict[str, int]:
        out = (ctypes.c_uint64 * 3)()
        self.lib.nat_stats(self.h, out)
        return {"fast_out": out[0], "fast_in": out[1], "slow": out[2]}


def _inside_key(vni: int, buf: bytes | bytearray) -> tuple[int, int, int, int] | None:
    ip = parse_ip4(buf)
    if ip is None or ip.is_fragment:
        return None
    ports = l4_ports(buf, ip)
    return None if ports is None else (vni, ip.src, ports[0], ip.proto)


def _outside_key(buf: bytes | bytearray) -> tuple[int, int, int] | None:
    ip = parse_ip4(buf)
    if ip is None or ip.is_fragment:
        return None
    ports = l4_ports(buf, ip)
    if ports is None:
        return None
    return (ip.dst, ports[0] if ip.proto == PROTO_ICMP else ports[1], ip.proto)


__all__ = ["FastNat", "FastPathUnavailable", "carray", "load"]
