"""The NAT role's native stage (native/nat_stage.c, nat_create.c, nat_vpcs.c; include/tj_nat.h) behind ctypes, the
Python reference its slow path.

`FastNat` has NatTable's interface. C translates established mappings (TCP handshake and teardown included: C
keeps the established/closing bits, merged back here) and creates new ones (the reference's rules, EIP choice and
port allocation, step for step), logging each; the reference takes the log in (`absorb`) before it decides
anything, so it holds every mapping. On a miss (no rule or port, a peer beyond NAT_MAX_PEERS, DNAT, ICMP error,
hairpin, anything malformed) the packet goes to the reference, which decides exactly as it would alone, its new
mappings' ports coming from the C allocator (`nat_reserve`), and the result is pushed into the C table. Expiry is
the reference's: C's sweep (`nat_idle`) names the candidates, the reference decides and removes them.

Policy crosses into C per VPC (`update_vpc`: one `tj_nat_vpc_t` record), so a change to one tenant costs that
tenant; `crossed` counts the calls and bytes that went in.

The library is compiled on the target machine by native/Makefile (run by `make setup`, or on first load).
"""

from __future__ import annotations

import ctypes
import gc
from collections import Counter
from dataclasses import replace

from nfv_gateways.core.packet import PROTO_ICMP, l4_ports, parse_ip4
from nfv_gateways.native.api import FastPathUnavailable, carray, constants, record_format, structure
from nfv_gateways.native.api import load as load_library
from nfv_gateways.roles.nat.policy import NatConfig, NatSettings, VpcNat, changed_vpcs
from nfv_gateways.roles.nat.reference import Mapping, NatTable, Verdict

LIB = "_nat_fp.so"  # the NAT stage alone (native/Makefile); every data-plane library carries it too
EVENTS_PER_CALL = 4096


def load() -> ctypes.CDLL:
    return load_library(LIB)


def vpc_record(v: VpcNat) -> tuple[ctypes.Structure, tuple, int]:
    """One VPC's policy as C takes it: the record, the arrays it points to (kept alive by the caller for the
    call), and the bytes that cross."""
    rule_t, static_t, dnat_t = structure("tj_snat_rule_t"), structure("tj_static_eip_t"), structure("tj_dnat_rule_t")
    eips = [e for r in v.snat for e in r.eips]
    firsts = [sum(len(x.eips) for x in v.snat[:i]) for i in range(len(v.snat))]
    snat = (rule_t * max(len(v.snat), 1))(*[rule_t(r.net, r.mask, f, len(r.eips))
                                             for r, f in zip(v.snat, firsts, strict=True)])
    statics = (static_t * max(len(v.static), 1))(*[static_t(s.ip, s.eip) for s in v.static])
    dnat = (dnat_t * max(len(v.dnat), 1))(*[dnat_t(d.eip, d.ip, d.port, d.iport, d.proto) for d in v.dnat])
    e = carray(ctypes.c_uint32, eips)
    rec = structure("tj_nat_vpc_t")(v.vni, v.mtu or 0, len(v.snat), len(eips), len(v.static), len(v.dnat),
                                    ctypes.cast(snat, ctypes.c_void_p), ctypes.cast(e, ctypes.c_void_p),
                                    ctypes.cast(statics, ctypes.c_void_p), ctypes.cast(dnat, ctypes.c_void_p))
    size = ctypes.sizeof(rec) + len(v.snat) * ctypes.sizeof(rule_t) + 4 * len(eips) + \
        len(v.static) * ctypes.sizeof(static_t) + len(v.dnat) * ctypes.sizeof(dnat_t)
    return rec, (snat, statics, dnat, e), size


class FastNat:
    """NatTable's interface; C for established flows, the Python reference for everything else."""

    def __init__(self, config: NatConfig, capacity_pow2: int = 1 << 16, lib: ctypes.CDLL | None = None) -> None:
        self.lib = lib if lib is not None else load()
        k = constants(self.lib)
        self._out, self._in, self._max_peers = k["NAT_OUT"], k["NAT_IN"], k["NAT_MAX_PEERS"]
        self._event = record_format("nat_event_t")
        self.h = self.lib.nat_create(capacity_pow2)
        if not self.h:
            raise FastPathUnavailable("nat_create failed (out of memory?)")
        self.crossed: Counter[str] = Counter()  # policy calls into C, and their bytes
        self.ref = _CAllocatedTable(replace(config, vpcs=()), self)
        self.python_only: set[tuple[int, int, int, int]] = set()  # mappings the C table had no room for
        self._events = ctypes.create_string_buffer(self._event.size * EVENTS_PER_CALL)
        self._push_settings(config.settings())
        for v in config.vpcs:
            self.update_vpc(v.vni, v)

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

    @property
    def settings(self) -> NatSettings:
        return self.ref.settings

    def _push_settings(self, s: NatSettings) -> None:
        self.lib.nat_set_ports(self.h, s.port_lo, s.port_hi)
        self.lib.nat_set_mtu(self.h, s.mtu)
        self.lib.nat_set_external_mtu(self.h, s.external_mtu)

    def update_vpc(self, vni: int, policy: VpcNat | None) -> list[Mapping]:
        """One VPC's policy, into C first (what its loop creates from here on is by it, and what it created before
        is in the log, taken in before the reference looks at which mappings the change removes), then the
        reference's; the mappings removed are deleted from C too."""
        if policy is None:
            self.lib.nat_remove_vpc(self.h, vni)
            self.crossed["calls"] += 1
        else:
            rec, _arrays, size = vpc_record(policy)
            if self.lib.nat_set_vpc(self.h, ctypes.byref(rec)) != 0:
                raise FastPathUnavailable("nat_set_vpc failed (out of memory)")
            self.crossed["calls"] += 1
            self.crossed["bytes"] += size
        self.absorb()
        gone = self.ref.update_vpc(vni, policy)
        for m in gone:
            self._delete(m)
        return gone

    def update_config(self, config: NatConfig) -> list[Mapping]:
        """A whole config: its settings, and the VPCs whose policy differs, each on its own."""
        self._push_settings(config.settings())
        self.ref.settings = config.settings()
        return [m for vni, policy in changed_vpcs(self.ref.vpcs, config) for m in self.update_vpc(vni, policy)]

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
        by_in, by_out, total, ev = self.ref.by_inside, self.ref.by_outside, 0, self._event
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            while True:
                n = self.lib.nat_events(self.h, self._events, EVENTS_PER_CALL)
                for vni, ip, eip, pip, port, eport, pport, proto, _kind, now in \
                        ev.iter_unpack(memoryview(self._events)[:n * ev.size]):
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
        t, cap = self.ref.settings.timeouts, self.lib.nat_count(self.h) + 1
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


__all__ = ["FastNat", "FastPathUnavailable", "load", "vpc_record"]
