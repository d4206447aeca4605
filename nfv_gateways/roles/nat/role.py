"""The NAT role: SNAT, 1:1 EIPs and DNAT per VPC (reference.py holds the semantics; native.py runs the same in C
on the data plane, new and established flows). Each VPC's section becomes a `VpcNat`, installed on its own."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING

from nfv_gateways.core.options import GatewayOptions
from nfv_gateways.core.packet import PROTO_TCP, PROTO_UDP, ip2int
from nfv_gateways.core.role import PacketStage, apply_by_vni
from nfv_gateways.core.sections import VpcParts
from nfv_gateways.roles.nat.policy import DnatRule, NatConfig, SnatRule, StaticEip, VpcNat
from nfv_gateways.roles.nat.reference import NatTable
from nfv_gateways.roles.nat.store import DictStore, capacity_of
from tianji.southbound import NatSection

if TYPE_CHECKING:
    from nfv_gateways.native.dataplane import NativeDataPlane

log = logging.getLogger("tianji.gateway")
PROTO = {"tcp": PROTO_TCP, "udp": PROTO_UDP}


def vpc_nat(x: NatSection) -> VpcNat:
    """A VPC section's NAT policy."""
    vpc = x.vpc
    return VpcNat(vpc.vni,
                  tuple(SnatRule(vpc.vni, r.cidr, tuple(ip2int(e) for e in r.eips)) for r in vpc.snat if r.eips),
                  tuple(StaticEip(s.vni, ip2int(s.ip), ip2int(s.eip)) for s in x.static),
                  tuple(DnatRule(ip2int(d.eip), PROTO[d.protocol], d.external_port, d.vni, ip2int(d.ip),
                                 d.internal_port) for d in x.dnat),
                  vpc.mtu)


class NatRole:
    name = "nat"
    expiry_interval = 5.0

    def __init__(self, o: GatewayOptions, counters: Counter[str]) -> None:
        self.o, self.counters = o, counters
        self.table: NatTable | None = None
        self._vni: dict[str, int] = {}  # VPC id -> the VNI its policy is installed under

    def attach(self, dp: NativeDataPlane | None) -> PacketStage:
        if dp is None or dp.lib is None:  # no C library: the reference (behind a frames interface in tests)
            self.table = NatTable(NatConfig(), DictStore(capacity_of(self.o.nat_mappings)))
            return self.table
        from nfv_gateways.roles.nat.native import FastNat

        fast = FastNat(NatConfig(), capacity_pow2=self.o.nat_mappings, lib=dp.lib)
        dp.use_nat(fast.h)
        self.table = fast
        return fast

    def policy_of(self, section: NatSection) -> VpcNat:
        return vpc_nat(section)

    def apply(self, parts: Mapping[str, VpcParts], touched: set[str], first: bool) -> None:
        """Each touched VPC's policy on its own: the table looks at that VPC's mappings only."""
        assert self.table is not None
        apply_by_vni(self.table.update_vpc, self._vni, parts, touched)
        self.counters["config_nat_applies"] += 1

    def expire(self, now: float) -> None:
        """The NAT's timers are its table's (the instance expires the stage)."""

    def status(self) -> dict:
        """The mappings held, the NAT's counters and, on the native table, what C did alone (fast_out, fast_in,
        slow: packets it declined to the reference, created: mappings the loop made, peers_replaced)."""
        t = self.table
        native = t.stats() if hasattr(t, "stats") else {}
        return {"mappings": len(t.store), "nat": dict(t.counters), "nat_native": native,
                "nat_crossed": dict(getattr(t, "crossed", {}))}
