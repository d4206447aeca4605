"""Compile a NAT gateway instance's config, one section per VPC.

An instance's config is a section for every VPC whose NAT gateways, 1:1 EIPs or DNAT rules it serves (see
`GatewaySection`). A section follows its VPC's revision (every NAT gateway, EIP association, SNAT and DNAT write,
and every port write, stamps the VPC) and the topology (which instances are live, hence where each EIP is homed),
so it is cached in `FRAGMENTS` per (instance, VPC) at those two versions. A write recompiles the sections of the
VPCs it stamped, and only for the instances that hold them: with 1,000 tenants a write in one costs one section,
not the 2 MB config. The digest of a config is made of its sections' digests, computed once per section.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass
from typing import NamedTuple

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from controller import models as m
from controller.compiler import endpoints_fragments, hosts_fragment
from controller.fragments import FRAGMENTS, cached, store
from controller.host_reads import Q_ENDPOINTS, Q_HOSTS, Reads
from controller.placement import home, nat_buckets
from controller.sqlset import in_ids
from tianji.southbound import (
    DnatInfo,
    GatewayConfig,
    GatewayConfigDelta,
    GatewaySection,
    GatewayVpc,
    SnatInfo,
    StaticEip,
    gateway_config_of,
)

_PORTS, _EIPS = m.Port.__table__, m.Eip.__table__
_NATGWS, _NATGW_EIPS = m.NatGateway.__table__, m.NatGatewayEip.__table__
_SNAT, _DNAT = m.SnatRule.__table__, m.DnatRule.__table__

# The instance, the topology stamp, and every VPC a gateway instance may serve (one with a NAT gateway or a port
# with an EIP), with its revision: what decides whether an instance's config changed. One round trip.
Q_GATEWAY_VIEW = text("""
    SELECT h.vtep_ip, (SELECT value FROM counters WHERE name = 'topology') AS topology,
           (SELECT value FROM counters WHERE name = 'revision') AS at,
           v.id, v.revision, v.vni, v.router_mac
    FROM hosts h LEFT JOIN (SELECT id, revision, vni, router_mac FROM vpcs
                            WHERE id IN (SELECT vpc_id FROM nat_gateways)
                               OR id IN (SELECT p.vpc_id FROM eips e JOIN ports p ON p.id = e.port_id)) v ON 1 = 1
    WHERE h.name = :name""")
Q_NAT_GATEWAYS = select(_NATGWS.c.vpc_id, _NATGWS.c.id, _NATGW_EIPS.c.eip_id, _EIPS.c.address) \
    .outerjoin(_NATGW_EIPS, _NATGW_EIPS.c.nat_gateway_id == _NATGWS.c.id) \
    .outerjoin(_EIPS, _EIPS.c.id == _NATGW_EIPS.c.eip_id) \
    .where(in_ids(_NATGWS.c.vpc_id, "vpcs")).order_by(_NATGWS.c.id, _NATGW_EIPS.c.eip_id)
Q_SNAT = select(_NATGWS.c.vpc_id, _SNAT.c.nat_gateway_id, _SNAT.c.cidr, _SNAT.c.eip_ids) \
    .join(_NATGWS, _NATGWS.c.id == _SNAT.c.nat_gateway_id).where(in_ids(_NATGWS.c.vpc_id, "vpcs")) \
    .order_by(_SNAT.c.cidr, _SNAT.c.nat_gateway_id)
Q_STATIC = select(_PORTS.c.vpc_id, _EIPS.c.id, _EIPS.c.address, _PORTS.c.ip) \
    .join(_PORTS, _PORTS.c.id == _EIPS.c.port_id).where(in_ids(_PORTS.c.vpc_id, "vpcs")).order_by(_EIPS.c.address)
Q_DNAT = select(_NATGWS.c.vpc_id, _DNAT.c.nat_gateway_id, _DNAT.c.eip_id, _EIPS.c.address, _DNAT.c.protocol,
                _DNAT.c.external_port, _PORTS.c.ip, _DNAT.c.internal_port) \
    .join(_NATGWS, _NATGWS.c.id == _DNAT.c.nat_gateway_id).join(_EIPS, _EIPS.c.id == _DNAT.c.eip_id) \
    .join(_PORTS, _PORTS.c.id == _DNAT.c.port_id).where(in_ids(_NATGWS.c.vpc_id, "vpcs")) \
    .order_by(_EIPS.c.address, _DNAT.c.protocol, _DNAT.c.external_port)


class _Vpc(NamedTuple):
    revision: int
    vni: int
    router_mac: str


@dataclass(frozen=True)
class GatewayCompiled:
    """An instance's sections (VPC id -> (section, its digest)), with the stamps they were compiled at."""

    name: str
    at: int  # the revision of the snapshot compiled
    vtep_ip: str | None
    topology: int
    universe: frozenset[str]  # every VPC a gateway instance may serve: what a write must touch to concern this one
    revisions: dict[str, int]  # VPC id -> revision, for the VPCs with a section
    sections: dict[str, tuple[GatewaySection, str]]
    vteps: tuple
    vteps_digest: str

    @property
    def digest(self) -> str:
        """What the config says, without the revision it was compiled at: the same sections give the same digest
        whatever was written elsewhere meanwhile."""
        h = hashlib.sha256(f"{self.vtep_ip}|{self.vteps_digest}".encode())
        for vid in sorted(self.sections):
            h.update(self.sections[vid][1].encode())
        return h.hexdigest()[:32]

    def config(self) -> GatewayConfig:
        return gateway_config_of(self.name, self.at, self.vtep_ip,
                                 [self.sections[v][0] for v in sorted(self.sections)], list(self.vteps))

    def delta(self, base: int) -> GatewayConfigDelta:
        """What takes the config at `base` to this one: every section when the topology moved after `base` (homes
        of EIPs and instances may have moved), else the sections of the VPCs stamped after it."""
        whole = base < 0 or self.topology > base
        changed = sorted(v for v, rev in self.revisions.items() if whole or rev > base)
        return GatewayConfigDelta.model_construct(
            name=self.name, revision=self.at, base=-1 if whole else base, vtep_ip=self.vtep_ip,
            vpc_ids=sorted(self.sections), sections=[self.sections[v][0] for v in changed],
            vteps=list(self.vteps) if whole else None)


def compile_gateway_sections(s: Session, name: str) -> GatewayCompiled | None:
    """Two round trips at most: the view (Q_GATEWAY_VIEW), then what the cache does not hold, read together."""
    rows = s.execute(Q_GATEWAY_VIEW, {"name": name}).tuples().all()
    if not rows:
        return None
    vtep_ip, topology, at = rows[0][:3]
    # id -> (revision, vni, router MAC), from plain tuples: a Row's attribute access was most of a compile
    vpcs = {vid: (rev, vni, rmac) for _, _, _, vid, rev, vni, rmac in rows if vid is not None}
    versions = {vid: (v[0], topology) for vid, v in vpcs.items()}
    hosts_frag = FRAGMENTS.get(s, ("hosts",), topology)
    got = FRAGMENTS.get_many(s, {("gateway", name, vid): version for vid, version in versions.items()})
    sections: dict[str, tuple[GatewaySection, str] | None] = {k[2]: v[0] for k, v in got.items()}
    stale = [vid for vid in versions if vid not in sections]
    reads = Reads()
    if hosts_frag is None:
        reads.add("hosts", Q_HOSTS)
    # a VPC's endpoints are the same fragment the hosts' compiles use, at the same (revision, topology)
    endpoints, stale_endpoints = cached(s, "endpoints", {v: versions[v] for v in stale})
    if stale:
        for key, stmt in (("gateways", Q_NAT_GATEWAYS), ("snat", Q_SNAT), ("static", Q_STATIC), ("dnat", Q_DNAT)):
            reads.add(key, stmt, vpcs=stale)
    if stale_endpoints:
        reads.add("endpoints", Q_ENDPOINTS, vpcs=stale_endpoints)
    got_rows = reads.run(s)
    if hosts_frag is None:
        hosts_frag = hosts_fragment(got_rows["hosts"])
        FRAGMENTS.put(s, ("hosts",), topology, hosts_frag)
    vteps, instances = hosts_frag
    instances = instances or ({name: vtep_ip} if vtep_ip else {})  # no live instance: compile as if this one were
    if stale:
        store(s, "endpoints", versions,
               endpoints_fragments(got_rows["endpoints"], {v: _Vpc(*vpcs[v]) for v in stale_endpoints}), endpoints)
        built = _sections(name, {v: _Vpc(*vpcs[v]) for v in stale}, got_rows, endpoints, instances)
        for vid in stale:
            sections[vid] = built.get(vid)
            FRAGMENTS.put(s, ("gateway", name, vid), versions[vid], (sections[vid],))
    present = {vid: sec for vid, sec in sections.items() if sec is not None}
    vteps_digest = FRAGMENTS.get(s, ("vteps-digest",), topology)
    if vteps_digest is None:
        vteps_digest = (_digest("|".join(f"{v.host},{v.ip},{v.kind}" for v in vteps)),)
        FRAGMENTS.put(s, ("vteps-digest",), topology, vteps_digest)
    return GatewayCompiled(name, at, vtep_ip, topology, frozenset(vpcs), {vid: vpcs[vid][0] for vid in present},
                           present, vteps, vteps_digest[0])


Q_HAS_NAT_GATEWAY = select(_NATGWS.c.id).where(in_ids(_NATGWS.c.vpc_id, "vpcs")).limit(1)
Q_HAS_EIP_PORT = select(_EIPS.c.id).join(_PORTS, _PORTS.c.id == _EIPS.c.port_id) \
    .where(in_ids(_PORTS.c.vpc_id, "vpcs")).limit(1)


def may_serve(s: Session, vpcs: set[str]) -> bool:
    """Whether any of these VPCs (written to, outside the instances' view) now has something gateways serve."""
    return any(s.execute(q, {"vpcs": sorted(vpcs)}).first() for q in (Q_HAS_NAT_GATEWAY, Q_HAS_EIP_PORT))


def _digest(text_: str) -> str:
    return hashlib.sha256(text_.encode()).hexdigest()[:32]


def _sections(name: str, vpcs: dict, rows: dict[str, list], endpoints: dict[str, tuple],
              instances: dict[str, str]) -> dict[str, tuple[GatewaySection, str]]:
    """The sections of these VPCs for instance `name`: the NAT gateways it serves (see nat_buckets) with SNAT by
    the EIPs homed here, the 1:1 EIPs homed here, and DNAT: rules on EIPs homed here (inbound), plus the reverse
    translation of every DNAT rule of a gateway it serves (the target VM's replies may fall in its buckets). A VPC
    with none of these has no section here."""
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
    for vid, v in vpcs.items():
        gws = gw_eips.get(vid, {})
        mine = {g for g, es in gws.items() if name in nat_buckets(g, [e for e, _ in es], instances)}
        addr = {e: a for es in gws.values() for e, a in es}
        snat = [SnatInfo.model_construct(cidr=r.cidr, eips=[addr[i] for i in r.eip_ids.split(",")
                                                           if i in addr and homed(i)])
                for r in by_vpc["snat"].get(vid, ()) if r.nat_gateway_id in mine]
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
        sec = GatewaySection.model_construct(
            vpc=GatewayVpc.model_construct(id=vid, vni=v.vni, router_mac=v.router_mac, snat=snat), static=static,
            dnat=dnat, endpoints=list(endpoints[vid]), eips=served)
        out[vid] = (sec, _digest(sec.model_dump_json()))
    return out
