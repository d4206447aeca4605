"""Compile a gateway instance's config, one section per VPC, by its role's compiler (`controller/roles/registry.py`).

An instance's config is a section for every VPC it serves something of (its role says what: NAT gateways, load
balancers, private lines, service endpoints; see `GatewaySection`). A section follows its VPC's revision (every
write to what a role serves, and every port write, stamps the VPC) and the topology (which instances are live, hence
where each EIP, line session or endpoint is homed), so it is cached in `FRAGMENTS` per (instance, VPC) at those two
versions. A write recompiles the sections of the VPCs it stamped, and only for the instances that hold them: with
1,000 tenants a write in one costs one section, not the 2 MB config. The digest of a config is made of its sections'
digests, computed once per section.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import NamedTuple

from sqlalchemy.orm import Session

from controller.roles.registry import compiler_of
from controller.roles.role import CompileInputs
from controller.southbound.compiler import endpoints_fragments, hosts_fragment
from controller.southbound.fragments import FRAGMENTS, cached, digest_of, store
from controller.state.reads import Q_ENDPOINTS, Q_HOSTS, Reads, gateway_view
from tianji.southbound import GatewayConfig, GatewayConfigDelta, GatewaySection, gateway_config_of


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
        whole = base < 0 or self.topology > base or base > self.at  # ahead of this database: a restore
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
    role_compiler = compiler_of(role)
    if stale:
        for key, stmt in role_compiler.reads:
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
        # placed over the live instances of its role (none live: compiled as if this one were)
        live = hosts_frag.live(role_compiler.name) or ({name: vtep_ip} if vtep_ip else {})
        built = role_compiler.sections(CompileInputs(name, {v: _Vpc(*vpcs[v]) for v in stale}, got_rows, endpoints,
                                                     live, hosts_frag, asn))
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
