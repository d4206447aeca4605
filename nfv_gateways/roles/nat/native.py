"""The NAT role's native stage (native/nat_stage.c, nat_flows.c, nat_table.c, nat_vpcs.c; include/tj_nat.h)
behind ctypes: the C table is the one owner of the mappings (c_store.py's `CStore`, the reference's FlowStore over
it), and `FastNat` is the reference's decisions over that store, C translating first.

C translates established flows and creates new ones by the reference's rules; what it declines (no rule, DNAT,
ICMP errors, hairpin, TTL, MTU, fragments, anything malformed) the reference decides over the same table: a
lookup and, if the mapping changed, a write (two calls into C). Expiry is C's, by the timeouts the store was
configured with. Policy crosses per VPC (`update_vpc`: one `tj_nat_vpc_t` record); `crossed` counts the calls.
"""

from __future__ import annotations

import ctypes
from collections import Counter

from nfv_gateways.native.api import FastPathUnavailable, carray, constants, structure
from nfv_gateways.native.api import load as load_library
from nfv_gateways.roles.nat.c_store import CStore
from nfv_gateways.roles.nat.policy import NatConfig, VpcNat
from nfv_gateways.roles.nat.reference import Mapping, NatTable, Verdict

LIB = "_nat_fp.so"  # the NAT stage alone (native/Makefile); every data-plane library carries it too


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


class FastNat(NatTable):
    """The reference's decisions over the C table, C translating first."""

    def __init__(self, config: NatConfig, capacity_pow2: int = 1 << 16, lib: ctypes.CDLL | None = None) -> None:
        self.lib = lib if lib is not None else load()
        k = constants(self.lib)
        self._out, self._in = k["NAT_OUT"], k["NAT_IN"]
        self.h = self.lib.nat_create(capacity_pow2)
        if not self.h:
            raise FastPathUnavailable("nat_create failed (out of memory?)")
        self.crossed: Counter[str] = Counter()  # calls into C (policy, lookups, writes) and the policy's bytes
        super().__init__(config, CStore(self.lib, self.h, self.crossed))

    def close(self) -> None:
        if self.h:
            self.lib.nat_destroy(self.h)
            self.h = None

    def __del__(self) -> None:
        self.close()

    @property
    def counters(self) -> Counter[str]:
        """The reference's counters plus what the fast path did on its own."""
        c = Counter(self.count)
        st = self.stats()
        c["out"] += st["fast_out"]
        c["in"] += st["fast_in"]
        c["mappings_created"] += st["created"]
        c["peers_replaced"] += st["peers_replaced"]
        return +c

    def update_vpc(self, vni: int, policy: VpcNat | None) -> list[Mapping]:
        """One VPC's policy, into C first (what its loop creates from here on is by it), then the reference's,
        which removes the mappings the change ends."""
        self.crossed["calls"] += 1
        if policy is None:
            self.lib.nat_remove_vpc(self.h, vni)
        else:
            rec, _arrays, size = vpc_record(policy)
            if self.lib.nat_set_vpc(self.h, ctypes.byref(rec)) != 0:
                raise FastPathUnavailable("nat_set_vpc failed (out of memory)")
            self.crossed["bytes"] += size
        return super().update_vpc(vni, policy)

    def outbound(self, vni: int, buf: bytearray, now: float) -> Verdict | None:
        raw = (ctypes.c_char * len(buf)).from_buffer(buf)
        done = self.lib.nat_outbound(self.h, vni, raw, len(buf), now) == self._out
        del raw  # the reference may replace the packet (time exceeded): no view of it may outlive the call
        return Verdict("out") if done else super().outbound(vni, buf, now)

    def inbound(self, buf: bytearray, now: float, hairpin: bool = False) -> Verdict | None:
        if hairpin:  # straight back in from our own outbound: the reference's alone (C would not know)
            return super().inbound(buf, now, hairpin)
        raw = (ctypes.c_char * len(buf)).from_buffer(buf)
        vni, ip = ctypes.c_uint32(), ctypes.c_uint32()
        done = self.lib.nat_inbound(self.h, raw, len(buf), now, ctypes.byref(vni), ctypes.byref(ip)) == self._in
        del raw
        return Verdict("in", vni.value, ip.value) if done else super().inbound(buf, now)

    def stats(self) -> dict[str, int]:
        out = (ctypes.c_uint64 * 5)()
        self.lib.nat_stats(self.h, out)
        return dict(zip(("fast_out", "fast_in", "slow", "created", "peers_replaced"), out, strict=True))


__all__ = ["CStore", "FastNat", "FastPathUnavailable", "load", "vpc_record"]
