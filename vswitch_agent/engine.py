"""The agent's desired flows, kept up to date incrementally: a change costs what it changes.

Flows are grouped into units, one per object of the host's config (a VTEP, a local VPC, an endpoint, a local
port, a security group, a load balancer), each remembering the inputs its flows were built from. What a kind of
unit reads is declared once, by name, in `NODES` (as OVN's incremental engine declares its nodes and their
inputs): a unit is built from exactly those inputs, passed by name to its builder, and rebuilt when one of them
differs; a builder cannot read anything its node does not name. `update` is told which VPCs a
config change touched (the controller's delta says so; a plug or unplug names its port's VPC); it rebuilds the
units of those VPCs whose inputs differ, and returns the flows to add and to delete. Nothing else is looked at,
so a new port in one VPC never walks the other 20,000 endpoints of the host.

Conjunctive clause flows of several units that share a match are merged into one flow (`flows.merge_conjunctive`);
the engine keeps the contributors per match so that a unit leaving takes only its conjunctions away.

Pure: no I/O. `desired` equals `flows.compute_flows` of the same inputs (tests/unit/test_engine.py checks it over
random change sequences).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tianji.southbound import HostConfig, VpcInfo
from vswitch_agent import flows as F
from vswitch_agent.flow import Flow
from vswitch_agent.lb_flows import lb_flows, members_here

UnitKey = tuple[str, ...]
BUCKETS = 4096  # the audit reads the switch in chunks of cookies with equal low bits


@dataclass(frozen=True)
class Node:
    """A kind of unit: the inputs its flows are built from (by name), and the builder that takes exactly those."""

    inputs: tuple[str, ...]
    build: Callable[..., list[Flow]]


# unit kind -> its node. The engine hands each builder the named inputs and nothing else; a unit is rebuilt when
# one of its inputs differs from the last build's.
NODES: dict[str, Node] = {
    "vtep": Node(("vtep", "tunnel_ofport"),
                 lambda vtep, tunnel_ofport: F.vtep_flows(vtep.host, vtep.ip, tunnel_ofport)),
    "vpc": Node(("vpc", "peers", "zone", "tunnel_ofport"), F.vpc_flows),
    "ep": Node(("endpoint", "reach", "host", "ofport", "tunnel_ofport"),
               lambda endpoint, reach, host, ofport, tunnel_ofport: F.endpoint_flows(endpoint, reach, host, ofport,
                                                                                    tunnel_ofport)),
    "port": Node(("port", "ofport", "vpc", "rules", "tunnel_ofport"),
                 lambda port, ofport, vpc, rules, tunnel_ofport: F.port_flows(port, ofport, vpc, rules,
                                                                             tunnel_ofport)),
    "sg": Node(("group", "vni", "zone"), lambda group, vni, zone: F.group_flows(group, vni, zone)),
    "lb": Node(("lb", "vpc", "reach", "members_here", "tunnel_ofport"),
               lambda lb, vpc, reach, members_here, tunnel_ofport: lb_flows(lb, vpc, reach, members_here,
                                                                            tunnel_ofport)),
}


class VpcView(NamedTuple):
    """What the units of a VPC's ports and load balancers, and the VPCs peering with it, read of it: a change to
    its routes or subnets does not rebuild them (a builder reading more fails on the missing attribute)."""

    id: str
    vni: int
    router_mac: str
    mtu: int  # a peering route checks packets against a peer's smaller MTU

    @classmethod
    def of(cls, v: VpcInfo) -> VpcView:
        return cls(v.id, v.vni, v.router_mac, v.mtu)


def _same(a: Any, b: Any) -> bool:
    return a is b or a == b


@dataclass
class Diff:
    add: list[Flow] = field(default_factory=list)
    delete: list[Flow] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.add or self.delete)


class FlowEngine:
    def __init__(self) -> None:
        self.units: dict[UnitKey, tuple[Any, tuple[Flow, ...]]] = {}  # key -> (deps, flows)
        self.by_vpc: dict[str, set[UnitKey]] = {}  # units that belong to a VPC (all but base and VTEPs)
        self.desired: dict[int, Flow] = {}  # cookie -> flow: exactly what br-int must hold
        self._refs: dict[int, int] = {}  # cookie -> units producing it, for the few flows more than one produces
        self._clauses: dict[tuple, dict[UnitKey, Flow]] = {}  # (table, priority, match) -> contributors
        self._merged: dict[tuple, Flow] = {}
        self._vpcs: dict[str, VpcInfo] = {}
        self._reach: dict[str, list] = {}
        self._tunnel: int | None = None
        self._vteps: Any = None
        self._local: set[str] = set()
        self.buckets: list[set[int]] = [set() for _ in range(BUCKETS)]  # desired cookies by their low bits
        self._added: dict[int, Flow] = {}  # the net change since the last update returned
        self._deleted: dict[int, Flow] = {}
        self._set(("base",), None, F.base_flows())

    # --- the one entry point ----------------------------------------------------------------------------------
    def update(self, cfg: HostConfig, ofports: Mapping[str, int], tunnel_ofport: int | None,
               zones: Mapping[str, int], changed: Iterable[str] | None) -> Diff:
        """Bring the desired flows to `cfg`; `changed`: the VPCs whose sections (or ports' plugging) may differ
        since the last call, None for all. Returns what to add and delete on the switch."""
        vpcs = {v.id: v for v in cfg.vpcs}
        everything = changed is None or tunnel_ofport != self._tunnel
        dirty = set(vpcs) | set(self._vpcs) if everything else set(changed)
        dirty |= set(self._vpcs) - set(vpcs)  # VPCs gone from the config: their units go
        for vid, v in vpcs.items():  # a VPC whose object changed without being named
            if vid not in dirty and self._vpcs.get(vid) is not v and self._vpcs.get(vid) != v:
                dirty.add(vid)
        local_ports: dict[str, list] = {}
        for p in cfg.ports:
            local_ports.setdefault(p.vpc_id, []).append(p)
        local_vpcs = sorted(local_ports)
        reach = F.reach_of(local_vpcs, vpcs)
        # endpoint VPCs whose reach changed (a peering or a local VPC came or went) are rebuilt too
        dirty |= {u for u in set(reach) | set(self._reach) if reach.get(u) != self._reach.get(u)}
        groups = {g.id: g for g in cfg.security_groups}

        if everything or cfg.vteps is not self._vteps:
            self._update_vteps(cfg, tunnel_ofport)
        for vid in local_vpcs:  # a few hundred at most: their inputs are compared every time
            vpc = vpcs[vid]
            peers = {k: VpcView.of(x) for k, x in F.peers_of(vpc, vpcs).items()}
            self._build(("vpc", vid), vid, vpc=vpc, peers=peers, zone=zones[vid], tunnel_ofport=tunnel_ofport)
        for vid in self._local - local_ports.keys():
            self._drop(("vpc", vid))
        if dirty:
            self._update_vpcs(cfg, dirty, vpcs, local_ports, groups, reach, ofports, tunnel_ofport, zones)
        self._vpcs, self._reach, self._tunnel, self._local = vpcs, reach, tunnel_ofport, set(local_ports)
        d = Diff(list(self._added.values()), list(self._deleted.values()))
        self._added, self._deleted = {}, {}
        return d

    # --- per kind of unit -------------------------------------------------------------------------------------
    def _update_vteps(self, cfg: HostConfig, tunnel_ofport: int | None) -> None:
        want = {("vtep", v.host): v for v in cfg.vteps if v.ip != cfg.vtep_ip}
        for key in [k for k in self.units if k[0] == "vtep" and k not in want]:
            self._drop(key)
        for key, v in want.items():
            self._build(key, None, vtep=v, tunnel_ofport=tunnel_ofport)
        self._vteps = cfg.vteps

    def _update_vpcs(self, cfg: HostConfig, dirty: set[str], vpcs: dict[str, VpcInfo], local_ports: dict,
                     groups: dict, reach: dict, ofports: Mapping[str, int], tunnel_ofport: int | None,
                     zones: Mapping[str, int]) -> None:
        want: dict[str, set[UnitKey]] = {vid: set() for vid in dirty}
        by_vpc = cfg.endpoints_by_vpc()
        for e in (e for vid in sorted(dirty) for e in by_vpc.get(vid, ())):
            key = ("ep", e.vpc_id, e.port_id)
            want[e.vpc_id].add(key)
            self._build(key, e.vpc_id, endpoint=e, reach=tuple(reach.get(e.vpc_id, [])), host=cfg.host,
                        ofport=ofports.get(e.port_id) if cfg.host in (e.host, e.also_host) else None,
                        tunnel_ofport=tunnel_ofport)
        for vid in dirty & local_ports.keys():
            vpc = vpcs[vid]
            for p in local_ports[vid]:
                of = ofports.get(p.id)
                if of is None:
                    continue
                key = ("port", vid, p.id)
                want[vid].add(key)
                rules = F.rule_ids(groups[g] for g in p.security_group_ids if g in groups)
                self._build(key, vid, port=p, ofport=of, vpc=VpcView.of(vpc), rules=rules, tunnel_ofport=tunnel_ofport)
        for g in cfg.security_groups:
            if g.vpc_id in dirty and g.vpc_id in zones:
                key = ("sg", g.vpc_id, g.id)
                want[g.vpc_id].add(key)
                self._build(key, g.vpc_id, group=g, vni=vpcs[g.vpc_id].vni, zone=zones[g.vpc_id])
        for vid in dirty & vpcs.keys():
            self._update_lbs(vpcs[vid], reach.get(vid, []), ofports, zones, tunnel_ofport, want[vid])
        for vid in dirty:
            have = self.by_vpc.get(vid, set())
            for key in [k for k in have if k[0] != "vpc" and k not in want[vid]]:
                self._drop(key)

    def _update_lbs(self, vpc: VpcInfo, reach: list, ofports: Mapping[str, int], zones: Mapping[str, int],
                    tunnel_ofport: int | None, want: set[UnitKey]) -> None:
        for lb in vpc.load_balancers:
            key = ("lb", vpc.id, lb.id)
            want.add(key)
            self._build(key, vpc.id, lb=lb, vpc=VpcView.of(vpc), reach=tuple(reach),
                        members_here=members_here(lb, ofports, zones), tunnel_ofport=tunnel_ofport)

    # --- bookkeeping ------------------------------------------------------------------------------------------
    def _build(self, key: UnitKey, vid: str | None, **inputs: Any) -> None:
        """Unit `key` (of kind key[0]) built from `inputs`, which must be exactly what its node names; rebuilt
        only when one of them differs from the last build's."""
        node = NODES[key[0]]
        if inputs.keys() != set(node.inputs):
            raise TypeError(f"unit {key[0]}: given {sorted(inputs)}, its node reads {sorted(node.inputs)}")
        deps = tuple(inputs[n] for n in node.inputs)
        u = self.units.get(key)
        if u is not None and len(u[0]) == len(deps) and all(_same(a, b) for a, b in zip(u[0], deps, strict=True)):
            return
        self._set(key, deps, node.build(**inputs), vid)

    def _set(self, key: UnitKey, deps: Any, new: list[Flow], vid: str | None = None) -> None:
        old = self.units[key][1] if key in self.units else ()
        self.units[key] = (deps, tuple(new))
        if vid is not None:
            self.by_vpc.setdefault(vid, set()).add(key)
        old_set, new_set = set(old), set(new)
        for f in old_set - new_set:
            self._release(key, f)
        for f in new_set - old_set:
            self._claim(key, f)

    def _drop(self, key: UnitKey) -> None:
        u = self.units.pop(key, None)
        if u is None:
            return
        if len(key) > 1 and key[0] != "vtep":
            owners = self.by_vpc.get(key[1])
            if owners is not None:
                owners.discard(key)
                if not owners:
                    del self.by_vpc[key[1]]
        for f in set(u[1]):
            self._release(key, f)

    def _claim(self, key: UnitKey, f: Flow) -> None:
        if f.conjunctive:
            mk = (f.table, f.priority, f.match)
            self._clauses.setdefault(mk, {})[key] = f
            self._remerge(mk)
            return
        if f.cookie in self.desired:
            self._refs[f.cookie] = self._refs.get(f.cookie, 1) + 1
        else:
            self._install(f)

    def _release(self, key: UnitKey, f: Flow) -> None:
        if f.conjunctive:
            mk = (f.table, f.priority, f.match)
            contributors = self._clauses[mk]
            contributors.pop(key, None)
            if not contributors:
                del self._clauses[mk]
            self._remerge(mk)
            return
        n = self._refs.pop(f.cookie, 1) - 1
        if n > 1:
            self._refs[f.cookie] = n
        elif n == 0:
            self._uninstall(f)

    def _remerge(self, mk: tuple) -> None:
        old = self._merged.pop(mk, None)
        contributors = self._clauses.get(mk)
        new = F.merge_conjunctive(contributors.values()) if contributors else None
        if new is not None:
            self._merged[mk] = new
        if old is not None and (new is None or old.cookie != new.cookie):
            self._uninstall(old)
        if new is not None and (old is None or old.cookie != new.cookie):
            self._install(new)

    def chunk(self, i: int, n: int) -> list[int]:
        """Desired cookies with cookie & (n - 1) == i (n a power of two, at most BUCKETS)."""
        return [c for b in range(i, BUCKETS, n) for c in self.buckets[b]]

    def _install(self, f: Flow) -> None:
        self.desired[f.cookie] = f
        self.buckets[f.cookie & (BUCKETS - 1)].add(f.cookie)
        if self._deleted.pop(f.cookie, None) is None:
            self._added[f.cookie] = f

    def _uninstall(self, f: Flow) -> None:
        if self.desired.pop(f.cookie, None) is None:
            return
        self.buckets[f.cookie & (BUCKETS - 1)].discard(f.cookie)
        if self._added.pop(f.cookie, None) is None:
            self._deleted[f.cookie] = f
