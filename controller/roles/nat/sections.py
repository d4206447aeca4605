"""The NAT role's sections: the NAT gateways an instance serves (see `placement.nat_buckets`) with SNAT by the EIPs
homed on it, the 1:1 EIPs homed on it, and DNAT."""

from __future__ import annotations

from collections import defaultdict

from controller.roles.role import CompileInputs, RoleCompiler, Sections, section_of
from controller.southbound.placement import home, nat_buckets
from controller.state.reads import Q_DNAT, Q_NAT_GATEWAYS_SERVED, Q_SNAT, Q_STATIC
from tianji.southbound import DnatInfo, NatSection, SnatInfo, StaticEip


def nat_sections(c: CompileInputs) -> Sections:
    """The sections of these VPCs for instance `c.name`: the NAT gateways it serves with SNAT by the EIPs homed
    here, the 1:1 EIPs homed here, and DNAT: rules on EIPs homed here (inbound), plus the reverse translation of
    every DNAT rule of a gateway it serves (the target VM's replies may fall in its buckets). A VPC with none of
    these has no section here."""
    name, instances, rows = c.name, c.live, c.rows
    gw_eips: dict[str, dict[str, list[tuple[str, str]]]] = defaultdict(lambda: defaultdict(list))
    for vid, gid, eid, address in rows["gateways"]:
        gw_eips[vid][gid] += [(eid, address)] if eid else []
    by_vpc: dict[str, dict[str, list]] = {key: defaultdict(list) for key in ("snat", "static", "dnat")}
    for key in by_vpc:
        for r in rows[key]:
            by_vpc[key][r.vpc_id].append(r)

    def homed(eid: str) -> bool:
        return home(f"eip:{eid}", instances) == name

    out = {}
    for vid, v in c.vpcs.items():
        gws = gw_eips.get(vid, {})
        mine = {g for g, es in gws.items() if name in nat_buckets(g, [e for e, _ in es], instances)}
        addr = {e: a for es in gws.values() for e, a in es}
        rules: dict[str, tuple[str, list[str]]] = {}  # SNAT rule -> (CIDR, its EIPs in order), rules in order
        for r in by_vpc["snat"].get(vid, ()):
            if r.nat_gateway_id in mine:
                rules.setdefault(r.id, (r.cidr, []))[1].append(r.eip_id)
        snat = [SnatInfo.model_construct(cidr=cidr, eips=[addr[i] for i in eids if i in addr and homed(i)])
                for cidr, eids in rules.values()]
        static = [StaticEip.model_construct(vni=v.vni, ip=r.ip, eip=r.address)
                  for r in by_vpc["static"].get(vid, ()) if homed(r.id)]
        dnat, dnat_here = [], set()
        for r in by_vpc["dnat"].get(vid, ()):
            if homed(r.eip_id):
                dnat_here.add(r.address)  # inbound to this EIP arrives here
            elif r.nat_gateway_id not in mine:
                continue  # neither its EIP nor the target VM's replies come here
            dnat.append(DnatInfo.model_construct(eip=r.address, protocol=r.protocol, external_port=r.external_port,
                                                 vni=v.vni, ip=r.ip, internal_port=r.internal_port))
        if not (mine or static or dnat):
            continue
        # ARP on the external side only for what is homed here (DNAT reverse translations are everywhere)
        served = sorted({a for x in snat for a in x.eips} | {x.eip for x in static} | dnat_here)
        out[vid] = section_of(NatSection, vid, v, snat=snat, static=static, dnat=dnat, endpoints=list(c.endpoints[vid]),
                              eips=served)
    return out


ROLE = RoleCompiler("nat", (("gateways", Q_NAT_GATEWAYS_SERVED), ("snat", Q_SNAT), ("static", Q_STATIC),
                            ("dnat", Q_DNAT)), nat_sections)
