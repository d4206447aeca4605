"""Compile a load-balancer instance's sections: one per VPC with load balancers, every load balancer in each (the
instances are active-active: each holds the same pools, so any of them picks the same member for a flow).

A pool sends to its members with weight that are not down; when every one of them is down it fails open and sends
to them all (as AWS NLB does: a health check that fails everywhere more likely says the checks are wrong). A
draining member (weight 0) stays, without table entries, until its deregistration delay has passed since it began
draining, so its established connections go on until then.
"""

from __future__ import annotations

from typing import Any

from controller.roles.role import CompileInputs, RoleCompiler, Sections, section_of
from controller.southbound.placement import home
from controller.state.reads import Q_LB_MEMBERS
from tianji.served import LbListenerServed, LbMemberServed, LbServed
from tianji.southbound import LbSection

DOWN = "OFFLINE"


def by_listener(rows: list) -> dict[str, tuple[Any, dict[tuple[str, int], list]]]:
    """Q_LB_MEMBERS' rows per load balancer: (its first row, listener (protocol, port) -> the listener's rows, one
    per member, or one with no member)."""
    lbs: dict[str, tuple[Any, dict[tuple[str, int], list]]] = {}
    for r in rows:
        _, listeners = lbs.setdefault(r.id, (r, {}))
        if r.protocol is not None:
            listeners.setdefault((r.protocol, r.port), []).append(r)
    return lbs


def _members(rows: list) -> list[LbMemberServed]:
    weighted = [r for r in rows if r.weight > 0]
    up = [r for r in weighted if r.operating_status != DOWN] or weighted  # all down: fail open
    out = [LbMemberServed.model_construct(id=r.member_id, ip=r.member_ip, weight=r.weight, drain_until=None)
           for r in up]
    out += [LbMemberServed.model_construct(id=r.member_id, ip=r.member_ip, weight=0,
                                           drain_until=r.status_changed_at.timestamp() + r.deregistration_delay_s)
            for r in rows if r.weight == 0]
    return sorted(out, key=lambda x: x.id)


def lb_sections(c: CompileInputs) -> Sections:
    """The sections of these VPCs for LB instance `c.name` (Q_LB_MEMBERS' rows). Every instance serves a load
    balancer's EIP alike (the same Maglev tables: an edge router may spread it over all of them, and any of them may
    carry a member's reply); it is homed on one, which answers ARP for it on a flat external segment."""
    name, vpcs, lb_instances = c.name, c.vpcs, c.live
    by_vpc: dict[str, list[LbServed]] = {}
    member_ips: dict[str, set[str]] = {}
    homed: set[str] = set()
    for r, lb_listeners in by_listener(c.rows["lbs"]).values():
        eip = r.eip if r.eip_id else None
        if eip and home(f"eip:{r.eip_id}", lb_instances) == name:
            homed.add(eip)
        listeners = []
        for (proto, port), lrows in lb_listeners.items():
            first = lrows[0]
            members = _members([x for x in lrows if x.member_id is not None])
            member_ips.setdefault(r.vpc_id, set()).update(x.ip for x in members)
            listeners.append(LbListenerServed.model_construct(
                protocol=proto, port=port, idle_timeout_s=float(first.idle_timeout_s),
                algorithm=first.algorithm or "maglev", table_size=first.table_size or 65537, members=members))
        by_vpc.setdefault(r.vpc_id, []).append(LbServed.model_construct(
            id=r.id, vni=vpcs[r.vpc_id].vni, vip=r.vip_address, eip=eip, listeners=listeners))
    out = {}
    for vid, served in by_vpc.items():
        ips = member_ips.get(vid, set())
        out[vid] = section_of(LbSection, vid, vpcs[vid], endpoints=[e for e in c.endpoints[vid] if e.ip in ips],
                              eips=sorted(b.eip for b in served if b.eip in homed), lbs=served)
    return out


ROLE = RoleCompiler("lb", (("lbs", Q_LB_MEMBERS),), lb_sections)
