"""The NAT role of the gateway framework: SNAT, 1:1 EIPs and DNAT per VPC (nat.py holds the semantics, the
native data plane runs the same on established flows in C)."""

from __future__ import annotations

import logging

from nfv_gateways.framework import Gateway, PacketStage, VpcParts
from nfv_gateways.nat import NatTable
from nfv_gateways.nat_config import NatConfig, SnatRule
from nfv_gateways.packet import PROTO_TCP, PROTO_UDP, ip2int
from tianji.southbound import GatewaySection

log = logging.getLogger("tianji.gateway")
PROTO = {"tcp": PROTO_TCP, "udp": PROTO_UDP}


def nat_policy(x: GatewaySection) -> tuple:
    """A VPC section's NAT rules, in the forms the NAT table takes: (SNAT rules, 1:1 EIPs, DNAT rules, its MTU)."""
    vpc = x.vpc
    return (tuple(SnatRule(vpc.vni, r.cidr, tuple(ip2int(e) for e in r.eips)) for r in vpc.snat if r.eips),
            tuple((s.vni, ip2int(s.ip), ip2int(s.eip)) for s in x.static),
            tuple((ip2int(d.eip), PROTO[d.protocol], d.external_port, d.vni, ip2int(d.ip), d.internal_port)
                  for d in x.dnat),
            ((vpc.vni, vpc.mtu),))


def nat_config(parts: dict[str, VpcParts]) -> NatConfig:
    ordered = [parts[v].policy for v in sorted(parts)]
    return NatConfig(snat=tuple(r for p in ordered for r in p[0]), static=tuple(x for p in ordered for x in p[1]),
                     dnat=tuple(d for p in ordered for d in p[2]), vpc_mtus=tuple(m for p in ordered for m in p[3]))


class NatGateway(Gateway):
    role = "nat"
    natc: NatConfig | None = None  # the NAT rules applied

    def make_stage(self) -> tuple[PacketStage, str]:
        if self.dp is not None:  # given by the caller (tests)
            return self.dp.nat, self.dp.backend
        fp, config = self.o.fastpath, NatConfig()
        if (dp := self.native_dataplane("nat")) is not None:
            self.dp = dp
            return dp.nat, f"{dp.backend} (packet I/O, new and established flows in C)"
        if fp == "auto":
            log.warning("no native data plane started: using the Python path")
        return NatTable(config), "python"

    def policy_of(self, section: GatewaySection) -> tuple:
        return nat_policy(section)

    def apply_policy(self, parts: dict[str, VpcParts], touched: set[str], first: bool) -> None:
        """The NAT rules are replaced as a whole; the table then looks only at the mappings of the VPCs whose
        SNAT rules changed."""
        self.natc = nat_config(parts)
        self.table.update_config(self.natc)
        self.counters["config_nat_applies"] += 1

    def role_status(self) -> dict:
        """The mappings held, the NAT's counters and, on the native table, what C did alone (fast_out, fast_in,
        slow: packets that went to the reference, created: mappings the loop made, events_full)."""
        native = self.table.stats() if hasattr(self.table, "stats") else {}
        return {"mappings": len(getattr(self.table, "ref", self.table).by_inside), "nat": dict(self.table.counters),
                "nat_native": native}
