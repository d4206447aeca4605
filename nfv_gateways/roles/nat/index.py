"""The NAT's policy as a packet is looked up in it across VPCs (1:1 EIPs both ways, DNAT'd ports and their
targets, the EIPs served), kept per VPC: `replace` takes one VPC's entries out and puts its new ones in."""

from __future__ import annotations

from collections import Counter

from nfv_gateways.roles.nat.policy import DnatRule, VpcNat


class PolicyIndex:
    def __init__(self) -> None:
        self.vpcs: dict[int, VpcNat] = {}
        self.static_in: dict[tuple[int, int], int] = {}  # (vni, ip) -> eip
        self.static_out: dict[int, tuple[int, int]] = {}  # eip -> (vni, ip)
        self.dnat: dict[tuple[int, int, int], DnatRule] = {}  # (eip, proto, port) ->
        self.dnat_rev: dict[tuple[int, int, int, int], DnatRule] = {}  # (vni, ip, iport, proto) ->
        self.served: Counter[int] = Counter()  # the EIPs the VPCs name (a hairpin's destination is one)

    def replace(self, vni: int, policy: VpcNat | None) -> VpcNat | None:
        """VPC `vni`'s policy from what it was (returned) to `policy` (None: gone)."""
        old = self.vpcs.pop(vni, None)
        if old is not None:
            self._index(old, add=False)
        if policy is not None:
            self.vpcs[vni] = policy
            self._index(policy, add=True)
        return old

    def _index(self, v: VpcNat, add: bool) -> None:
        for s in v.static:
            if add:
                self.static_in[(s.vni, s.ip)] = s.eip
                self.static_out[s.eip] = (s.vni, s.ip)
            else:
                self.static_in.pop((s.vni, s.ip), None)
                self.static_out.pop(s.eip, None)
        for d in v.dnat:
            if add:
                self.dnat[(d.eip, d.proto, d.port)] = d
                self.dnat_rev[(d.vni, d.ip, d.iport, d.proto)] = d
            else:
                self.dnat.pop((d.eip, d.proto, d.port), None)
                self.dnat_rev.pop((d.vni, d.ip, d.iport, d.proto), None)
        for e in v.eips():
            self.served[e] += 1 if add else -1
            if self.served[e] <= 0:
                del self.served[e]


__all__ = ["PolicyIndex"]
