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

from sqlalchemy.orm import Session

from controller.compiler import endpoints_fragments, hosts_fragment
from controller.fragments import FRAGMENTS, cached, digest_of, store
from controller.lb_compiler import lb_sections
from controller.line_compiler import LINE_ROLE, line_sections
from controller.placement import home, nat_buckets
from controller.reads import (
    Q_DNAT,
    Q_ENDPOINTS,
    Q_GROUP_MEMBERS,
    Q_GROUP_RULES,
    Q_HOSTS,
    Q_LB_MEMBERS,
    Q_LINES,
    Q_NAT_GATEWAYS_SERVED,
    Q_PROVIDER_SIDES,
    Q_SERVICE_ENDPOINTS,
    Q_SERVICE_PEERS,
    Q_SNAT,
    Q_STATIC,
    Reads,
    gateway_view,
)
from controller.service_compiler import SERVICE_ROLE, service_sections
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


class _Vpc(NamedTuple):
    revision: int
    vni: int
    router_mac: str
    mtu: int


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


def compile_gateway_sections(s: Session, name: str, asn: int = 64512) -> GatewayCompiled | None:
    """Two round trips at most: the view (Q_GATEWAY_VIEW), then what the cache does not hold, read together.
    `asn`: the cloud's side of private lines' sessions (a setting: fixed for the controller's life)."""
    rows = gateway_view(s, name)
    if not rows:
        return None
    vtep_ip, topology, at, role, vteps_stamp = rows[0][:5]
    # id -> (revision, vni, router MAC), from plain tuples: a Row's attribute access was most of a compile
    vpcs = {vid: (rev, vni, rmac, mtu) for _, _, _, _, _, vid, rev, vni, rmac, mtu in rows if vid is not None}
    versions = {vid: (v[0], topology) for vid, v in vpcs.items()}
    hosts_version = (topology, vteps_stamp)  # the VTEP list and the live instances
    hosts_frag = FRAGMENTS.get(s, ("hosts",), hosts_version)
    got = FRAGMENTS.get_many(s, {("gateway", name, vid): version for vid, version in versions.items()})
    sections: dict[str, tuple[GatewaySection, str] | None] = {k[2]: v[0] for k, v in got.items()}
    stale = [vid for vid in versions if vid not in sections]
    reads = Reads()
    if hosts_frag is None:
        reads.add("hosts", Q_HOSTS)
    # a VPC's endpoints are the same fragment the hosts' compiles use, at the same (revision, topology)
    endpoints, stale_endpoints = cached(s, "endpoints", {v: versions[v] for v in stale})
    if stale:
        role_reads = ROLE_READS.get(role, NAT_READS)
        for key, stmt in role_reads:
            reads.add(key, stmt, vpcs=stale)
    if stale_endpoints:
        reads.add("endpoints", Q_ENDPOINTS, vpcs=stale_endpoints)
    got_rows = reads.run(s)
    if hosts_frag is None:
        hosts_frag = hosts_fragment(got_rows["hosts"])
        FRAGMENTS.put(s, ("hosts",), hosts_version, hosts_frag)
    vteps = hosts_frag.vteps
    if stale:
        store(s, "endpoints", versions,
               endpoints_fragments(got_rows["endpoints"], {v: _Vpc(*vpcs[v]) for v in stale_endpoints},
                                   hosts_frag.service_instances), endpoints)
        built = _role_sections(role, name, vtep_ip, {v: _Vpc(*vpcs[v]) for v in stale}, got_rows, endpoints,
                               hosts_frag, asn)
        for vid in stale:
            sections[vid] = built.get(vid)
            FRAGMENTS.put(s, ("gateway", name, vid), versions[vid], (sections[vid],))
    present = {vid: sec for vid, sec in sections.items() if sec is not None}
    vteps_digest = FRAGMENTS.get(s, ("vteps-digest",), hosts_version)
    if vteps_digest is None:
        vteps_digest = (digest_of("|".join(f"{v.host},{v.ip},{v.kind}" for v in vteps)),)
        FRAGMENTS.put(s, ("vteps-digest",), hosts_version, vteps_digest)
    # an instance takes every host change whole (its VTEP list is one digest): a few instances, rare changes
    return GatewayCompiled(name, at, vtep_ip, max(topology, vteps_stamp), frozenset(vpcs),
                           {vid: vpcs[vid][0] for vid in present}, present, vteps, vteps_digest[0])


ROLE_READS = {"lb": (("lbs", Q_LB_MEMBERS),), LINE_ROLE: (("lines", Q_LINES),),
              SERVICE_ROLE: (("svc", Q_SERVICE_ENDPOINTS), ("sides", Q_PROVIDER_SIDES), ("rules", Q_GROUP_RULES),
                             ("members", Q_GROUP_MEMBERS), ("peers", Q_SERVICE_PEERS))}
NAT_READS = (("gateways", Q_NAT_GATEWAYS_SERVED), ("snat", Q_SNAT), ("static", Q_STATIC), ("dnat", Q_DNAT))


def _role_sections(role: str, name: str, vtep_ip: str | None, vpcs: dict, rows: dict[str, list],
                   endpoints: dict[str, tuple], topo, asn: int) -> dict[str, tuple[GatewaySection, str]]:
    """The sections of these VPCs for instance `name` of `role`, placed over the live instances of its role (none
    live: compiled as if this one were)."""
    def live(instances: dict[str, str]) -> dict[str, str]:
        return instances or ({name: vtep_ip} if vtep_ip else {})

    if role == "lb":
        return lb_sections(name, vpcs, rows["lbs"], endpoints, live(topo.lb_instances))
    if role == LINE_ROLE:
        return line_sections(name, vpcs, rows["lines"], endpoints, live(topo.line_instances), asn)
    if role == SERVICE_ROLE:
        return service_sections(name, vpcs, rows, endpoints, live(topo.service_instances), topo.lb_instances)
    return _sections(name, vpcs, rows, endpoints, live(topo.instances))


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
        sec = GatewaySection.model_construct(
            vpc=GatewayVpc.model_construct(id=vid, vni=v.vni, router_mac=v.router_mac, mtu=v.mtu, snat=snat),
            static=static, dnat=dnat, endpoints=list(endpoints[vid]), eips=served)
        out[vid] = (sec, digest_of(sec.model_dump_json()))
    return out
