"""The native NAT stage (native/nat_stage.c, nat_create.c, include/tj_nat.h) behind ctypes, the Python reference
its slow path.

`FastNat` has NatTable's interface. C translates established mappings (TCP handshake and teardown included: C
keeps the established/closing bits, merged back here) and creates new ones (the reference's rules, EIP choice and
port allocation, step for step), logging each; the reference takes the log in (`absorb`) before it decides
anything, so it holds every mapping. On a miss (no rule or port, a peer beyond NAT_MAX_PEERS, DNAT, ICMP error,
hairpin, anything malformed) the packet goes to the reference, which decides exactly as it would alone, its new
mappings' ports coming from the C allocator (`nat_reserve`), and the result is pushed into the C table. Expiry is
the reference's: C's sweep (`nat_idle`) names the candidates, the reference decides and removes them.

The library is compiled on the target machine by native/Makefile (run by `make setup`, or on first load).
"""

from __future__ import annotations

import ctypes
import gc
import struct
from collections import Counter

from nfv_gateways.nat import Mapping, NatTable, Verdict, served_eips
from nfv_gateways.nat_config import NatConfig
from nfv_gateways.native_api import FastPathUnavailable, constants
from nfv_gateways.native_api import load as load_library
from nfv_gateways.packet import PROTO_ICMP, l4_ports, parse_ip4

LIB = "_nat_fp.so"  # the NAT stage alone (native/Makefile); every data-plane library carries it too
# nat_event_t (include/tj_nat.h): vni, ip, eip, peer ip; port, eport, peer port; proto, kind (0 new, 1 peer); now
EVENT = struct.Struct("=IIIIHHHBBd")
EVENTS_PER_CALL = 4096


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
        if k["NAT_EVENT_SIZE"] != EVENT.size:
            raise FastPathUnavailable("the library's NAT event record differs from fastpath.EVENT: rebuild it")
        self.h = self.lib.nat_create(capacity_pow2)
        if not self.h:
            raise FastPathUnavailable("nat_create failed (out of memory?)")
        self.ref = _CAllocatedTable(config, self)
        self.python_only: set[tuple[int, int, int, int]] = set()  # mappings the C table had no room for
        self._events = ctypes.create_string_buffer(EVENT.size * EVENTS_PER_CALL)
        self._push_config(config)

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
        c["mappings_created"] += st["created"]
        return +c

    def _push_config(self, c: NatConfig) -> None:
        u32 = ctypes.c_uint32
        firsts = [sum(len(x.eips) for x in c.snat[:i]) for i in range(len(c.snat))]
        eips = [e for r in c.snat for e in r.eips]
        if self.lib.nat_set_snat(self.h, carray(u32, [r.vni for r in c.snat]), carray(u32, [r.net for r in c.snat]),
                                 carray(u32, [r.mask for r in c.snat]), carray(u32, firsts),
                                 carray(u32, [len(r.eips) for r in c.snat]), len(c.snat), carray(u32, eips),
                                 len(eips)) != 0:
            raise FastPathUnavailable("nat_set_snat failed (out of memory)")
        self.lib.nat_set_ports(self.h, c.port_lo, c.port_hi)
        served = sorted(served_eips(c))
        self.lib.nat_set_served(self.h, carray(ctypes.c_uint32, served), len(served))
        self.lib.nat_set_mtu(self.h, c.mtu)
        self.lib.nat_set_external_mtu(self.h, c.external_mtu)
        vm = [(vni, mtu) for vni, mtu in c.vpc_mtus if mtu != c.mtu]
        if self.lib.nat_set_vpc_mtus(self.h, carray(ctypes.c_uint32, [v for v, _ in vm]),
                                     carray(ctypes.c_uint32, [m for _, m in vm]), len(vm)) != 0:
            raise FastPathUnavailable("nat_set_vpc_mtus failed (out of memory)")
        st = c.static
        dn = c.dnat  # (eip, proto, ext port, vni, ip, port)
        u32, u16, u8 = ctypes.c_uint32, ctypes.c_uint16, ctypes.c_uint8
        r = self.lib.nat_set_rules(self.h, carray(u32, [s[0] for s in st]), carray(u32, [s[1] for s in st]),
                                   carray(u32, [s[2] for s in st]), len(st), carray(u32, [d[0] for d in dn]),
                                   carray(u16, [d[2] for d in dn]), carray(u8, [d[1] for d in dn]),
                                   carray(u32, [d[3] for d in dn]), carray(u32, [d[4] for d in dn]),
                                   carray(u16, [d[5] for d in dn]), len(dn))
        if r != 0:
            raise FastPathUnavailable("nat_set_rules failed (out of memory)")

    def update_config(self, config: NatConfig) -> list[Mapping]:
        """C takes the new rules first: what its loop creates from here on is by them, and what it created before is
        in the log, taken in before the reference looks at which mappings the change removes."""
        self._push_config(config)
        self.absorb()
        gone = self.ref.update_config(config)
        for m in gone:
            self._delete(m)
        return gone

    def _delete(self, m: Mapping) -> None:
        """Remove from C a mapping the reference removed (a TCP one's port held as long as the reference holds it)."""
        key = (m.vni, m.ip, m.port, m.proto)
        self.lib.nat_del(self.h, *key, self.ref.held.get((m.eip, m.eport, m.proto), 0.0))
        self.python_only.discard(key)

    def _push(self, key: tuple[int, int, int, int]) -> None:
        m = self.ref.by_inside.get(key)
        if m is None:
            return
        peers = sorted(m.peers)[:self._max_peers]
        ips = (ctypes.c_uint32 * self._max_peers)(*[p[0] for p in peers])
        ports = (ctypes.c_uint16 * self._max_peers)(*[p[1] for p in peers])
        if self.lib.nat_put(self.h, m.vni, m.ip, m.port, m.proto, m.eip, m.eport, int(m.tcp_established),
                            int(m.tcp_closing), ips, ports, len(peers), m.last) != 0:
            self.python_only.add(key)  # translated by the reference alone, and expired by it
        else:
            self.python_only.discard(key)

    def absorb(self) -> int:
        """Take in the mappings and peers the C loop created since the last call; how many events. (Without the
        cyclic collector meanwhile: a batch allocates thousands of mappings that live on, and collecting
        generation after generation of them doubled the cost.)"""
        by_in, by_out, total = self.ref.by_inside, self.ref.by_outside, 0
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            while True:
                n = self.lib.nat_events(self.h, self._events, EVENTS_PER_CALL)
                for vni, ip, eip, pip, port, eport, pport, proto, _kind, now in \
                        EVENT.iter_unpack(memoryview(self._events)[:n * EVENT.size]):
                    key = (vni, ip, port, proto)
                    m = by_in.get(key)
                    if m is None or m.eport != eport or m.eip != eip:
                        if m is not None:  # the loop's mapping is the one packets are translated with
                            by_out.pop((m.eip, m.eport, proto), None)
                        by_in[key] = by_out[(eip, eport, proto)] = Mapping(vni, ip, port, proto, eip, eport, now,
                                                                           {(pip, pport)})
                        continue
                    m.peers.add((pip, pport))
                    if now > m.last:
                        m.last = now
                total += n
                if n < EVENTS_PER_CALL:
                    return total
        finally:
            if was_enabled:
                gc.enable()

    def sync(self) -> None:
        """Pull the last-seen times the fast path kept back into the reference (before expiry, for stats)."""
        self.absorb()
        for key in self.ref.by_inside:
            self.sync_one(key)

    def expire(self, now: float) -> int:
        self.absorb()
        t, cap = self.ref.config.timeouts, self.lib.nat_count(self.h) + 1
        vni, ip, port, proto = (ctypes.c_uint32 * cap)(), (ctypes.c_uint32 * cap)(), (ctypes.c_uint16 * cap)(), \
            (ctypes.c_uint8 * cap)()
        n = self.lib.nat_idle(self.h, now, t.udp, t.tcp_established, t.tcp_transitory, t.icmp, vni, ip, port, proto,
                              cap)
        keys = [(vni[i], ip[i], port[i], proto[i]) for i in range(n)] + list(self.python_only)
        for key in keys:
            self.sync_one(key)
        gone = self.ref.expire_mappings(now, [m for k in keys if (m := self.ref.by_inside.get(k)) is not None])
        for m in gone:
            self._delete(m)
        self.lib.nat_prune_held(self.h, now)
        return len(gone)

    def outbound(self, vni: int, buf: bytearray, now: float) -> Verdict | None:
        raw = (ctypes.c_char * len(buf)).from_buffer(buf)
        done = self.lib.nat_outbound(self.h, vni, raw, len(buf), now) == self._out
        del raw  # the reference may replace the packet (time exceeded): no view of it may outlive the call
        if done:
            return Verdict("out")
        self.absorb()
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
        self.absorb()
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
        out = (ctypes.c_uint64 * 5)()
        self.lib.nat_stats(self.h, out)
        return dict(zip(("fast_out", "fast_in", "slow", "created", "events_full"), out, strict=True))


class _CAllocatedTable(NatTable):
    """The reference, its new mappings' ports handed out by the C allocator (one allocator for the C loop's
    mappings and its own)."""

    def __init__(self, config: NatConfig, fast: FastNat) -> None:
        self.fast = fast
        super().__init__(config)

    def _reserve(self, vni: int, ip: int, port: int, proto: int, eip: int, now: float) -> tuple[int, int] | None:
        got = ctypes.c_uint32(eip)
        eport = self.fast.lib.nat_reserve(self.fast.h, vni, ip, port, proto, ctypes.byref(got), now)
        if eport == -2:
            self.counters["table_full"] += 1
        return None if eport < 0 else (got.value, eport)


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
