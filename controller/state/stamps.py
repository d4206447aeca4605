"""What a changed row affects, derived from the row: the VPCs, hosts and topology whose compiled configs it is part
of. A write never says what it touched; `Database.write()` stamps what its rows affect, in the same transaction:

* rows changed through the ORM, seen by a `before_flush` hook (`collect`), with their values before and after
  (a port moved from one host to another stamps both hosts);
* rows inserted by the Core fast path (`WriteTxn.defer`), mapped from the rows themselves (`rows_affect`);
* any other Core INSERT, UPDATE or DELETE on a table that configs are compiled from is refused (`guard`), except
  for the columns no config reads (a port's status, a host's last beat), so a new write cannot slip past.

The rules (`AFFECTS`): anything inside a VPC stamps the VPC; a port also stamps the hosts it is or was bound to
(a host compiles its own ports: their groups, EIPs, addresses); an EIP stamps its port's VPC and host; a peering
both VPCs; a host stamps itself, and the topology when what other hosts compile of it changes (VTEP, kind, role,
liveness). The compiler's caches and the delta watch rely on exactly these stamps (DEVELOPERS.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import inspect, select
from sqlalchemy.orm import ORMExecuteState, Session, UOWTransaction
from sqlalchemy.orm.attributes import get_history

from controller.state import models as m
from controller.state.table_base import LABELS

CHANGES = "tianji_changes"  # session.info key: the write's ChangeSet, present only inside Database.write()
STAMPED = {"tianji_stamped": True}  # execution option: a Core write whose rows were stamped already (defer)


@dataclass
class ChangeSet:
    """What one write affects (the VPCs, hosts and topology to stamp with its revision); once committed, what its
    watches are told, to decide whether to recompile."""

    revision: int = 0
    vpcs: set[str] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    topology: bool = False
    vteps: set[str] = field(default_factory=set)  # hosts whose VTEP entry appeared or changed
    removed: set[str] = field(default_factory=set)  # hosts whose VTEP entry went (deleted)
    traces: set[str] = field(default_factory=set)  # hosts with a live trace question (api/traces.py): no config

    @property
    def vteps_moved(self) -> bool:
        """The VTEP list every hypervisor holds changed: every watch is told (each gets the entries, not more)."""
        return bool(self.vteps or self.removed)

    def add(self, vpcs: Iterable[str | None] = (), hosts: Iterable[str | None] = (), topology: bool = False) -> None:
        self.vpcs.update(v for v in vpcs if v)
        self.hosts.update(h for h in hosts if h)
        self.topology = self.topology or topology


def _values(obj: Any, attr: str) -> list:
    """The attribute's value now and, if it changed in this transaction, before."""
    h = get_history(obj, attr)
    return [*h.added, *h.unchanged, *h.deleted] if h else [getattr(obj, attr)]


def _get(s: Session, model: type, ident: Any) -> Any:
    with s.no_autoflush:
        return s.get(model, ident) if ident is not None else None


def _vpc_of(s: Session, model: type, ident: Any) -> str | None:
    row = _get(s, model, ident)
    return None if row is None else row.vpc_id


def _port(s: Session, port_id: str | None, out: ChangeSet) -> None:
    p = _get(s, m.Port, port_id)
    if p is not None:
        out.add([p.vpc_id], _values(p, "host") + _values(p, "migrating_to"))


def _lb_vpc(s: Session, lb_id: str | None) -> str | None:
    return _vpc_of(s, m.LoadBalancer, lb_id)


def _pool_vpc(s: Session, pool_id: str | None) -> str | None:
    pool = _get(s, m.LbPool, pool_id)
    return None if pool is None else _lb_vpc(s, pool.load_balancer_id)


def _rule_vpc(s: Session, rule_id: str | None) -> str | None:
    rule = _get(s, m.SnatRule, rule_id)
    return None if rule is None else _vpc_of(s, m.NatGateway, rule.nat_gateway_id)


HOST_COMPILED = ("name", "vtep_ip", "kind", "role", "status")  # what configs read of a host (its beat is not)
VTEP_ENTRY = ("name", "vtep_ip", "kind")  # a host's entry in every hypervisor's VTEP list


def _host(s: Session, h: m.Host, out: ChangeSet, state: str) -> None:
    """What a host's change costs other hosts, as little as it affects (a registration or a beat that changes
    nothing compiled stamps nothing):
    * its VTEP entry (joining, leaving, a new address): that entry in every hypervisor's list (`vteps`,
      `removed`), and, for a new address, the VPCs of the ports bound to it (their endpoints carry it);
    * a gateway's role or liveness: the VPCs gateways serve (their EIP homes, NAT buckets, VIPs, line routes,
      service endpoints follow the live instances), never the others';
    * a hypervisor's liveness: nothing anyone compiles (its ports' status is reported, not compiled).
    The topology stamp (the live instances: it versions fragments) moves for gateways' changes only."""
    changed = set(HOST_COMPILED) if state != "dirty" else \
        {a for a in HOST_COMPILED if get_history(h, a).has_changes()}
    gateway = "gateway" in _values(h, "kind")
    entry = bool(changed & set(VTEP_ENTRY))
    if not (entry or gateway and changed):
        return
    out.add(hosts=[h.name], topology=gateway)
    if entry:
        (out.removed if state == "deleted" else out.vteps).add(h.name)
    if state == "dirty" and "vtep_ip" in changed:
        out.add(_bound_vpcs(s, h.name))
    if gateway:
        out.add(_served_vpcs(s))


def _bound_vpcs(s: Session, host: str) -> list[str]:
    with s.no_autoflush:
        return list(s.execute(select(m.Port.vpc_id).where((m.Port.host == host) | (m.Port.migrating_to == host))
                              .distinct()).scalars())


def _served_vpcs(s: Session) -> list[str]:
    from controller.state.reads import Q_SERVED_VPCS

    with s.no_autoflush:
        return list(s.execute(Q_SERVED_VPCS).scalars())


def _eip(s: Session, e: m.Eip, out: ChangeSet, _state: str) -> None:
    for pid in _values(e, "port_id"):
        _port(s, pid, out)


# model -> what a row of it affects (the session, the row, what to add to, "new" | "dirty" | "deleted")
def _endpoint_vpcs(s: Session, service_id: str) -> list[str]:
    """The VPCs with an endpoint of the service: they compile what it is (its addresses, ports, who may use it)."""
    with s.no_autoflush:
        return list(s.execute(select(m.ServiceEndpoint.vpc_id).where(m.ServiceEndpoint.service_id == service_id))
                    .scalars())


def _with_peers(s: Session, vpc_id: str) -> list[str]:
    """The VPC and those actively peered with it: a service instance holds a peer's section (its VMs reach the
    endpoints) only while the VPC has endpoints, so an endpoint's coming or going is news of the peers too."""
    from controller.state.reads import Q_SERVICE_PEERS

    with s.no_autoflush:
        return [vpc_id, *(r.peer_id for r in s.execute(Q_SERVICE_PEERS, {"vpcs": [vpc_id]}))]


AFFECTS: dict[type, Callable[[Session, Any, ChangeSet, str], None]] = {
    m.Vpc: lambda s, o, out, _: out.add([o.id]),
    m.Subnet: lambda s, o, out, _: out.add([o.vpc_id]),
    m.SecurityGroup: lambda s, o, out, _: out.add([o.vpc_id]),
    m.SecurityGroupRule: lambda s, o, out, _: out.add([_vpc_of(s, m.SecurityGroup, o.group_id)]),
    m.Port: lambda s, o, out, _: out.add([o.vpc_id], _values(o, "host") + _values(o, "migrating_to")),
    m.PortSecurityGroup: lambda s, o, out, _: _port(s, o.port_id, out),
    m.Peering: lambda s, o, out, _: out.add([o.requester_vpc_id, o.accepter_vpc_id]),
    m.Route: lambda s, o, out, _: out.add([o.vpc_id]),
    m.Eip: _eip,
    m.NatGateway: lambda s, o, out, _: out.add([o.vpc_id]),
    m.NatGatewayEip: lambda s, o, out, _: out.add([_vpc_of(s, m.NatGateway, o.nat_gateway_id)]),
    m.SnatRule: lambda s, o, out, _: out.add([_vpc_of(s, m.NatGateway, o.nat_gateway_id)]),
    m.SnatRuleEip: lambda s, o, out, _: out.add([_rule_vpc(s, o.rule_id)]),
    m.DnatRule: lambda s, o, out, _: out.add([_vpc_of(s, m.NatGateway, o.nat_gateway_id)]),
    m.LoadBalancer: lambda s, o, out, _: out.add([o.vpc_id]),
    m.LbListener: lambda s, o, out, _: out.add([_lb_vpc(s, o.load_balancer_id)]),
    m.LbPool: lambda s, o, out, _: out.add([_lb_vpc(s, o.load_balancer_id)]),
    m.LbMember: lambda s, o, out, _: out.add([_pool_vpc(s, o.pool_id)]),
    m.LbHealthMonitor: lambda s, o, out, _: out.add([_pool_vpc(s, o.pool_id)]),
    m.PrivateLine: lambda s, o, out, _: out.add([o.vpc_id]),
    m.PrivateLineStaticRoute: lambda s, o, out, _: out.add([_vpc_of(s, m.PrivateLine, o.line_id)]),
    m.PrivateLineLearned: lambda s, o, out, _: out.add([_vpc_of(s, m.PrivateLine, o.line_id)]),
    m.PrivateLinePlacement: lambda s, o, out, _: out.add([_vpc_of(s, m.PrivateLine, o.line_id)]),
    m.Host: _host,
    m.Service: lambda s, o, out, _: out.add(_endpoint_vpcs(s, o.id)),
    m.ServiceEndpoint: lambda s, o, out, _: out.add(_with_peers(s, o.vpc_id)),
}
# tables no config is compiled from: their rows stamp nothing
# (removed_hosts is compiled from, and written only by the stamp itself)
UNCOMPILED: frozenset[type] = frozenset({m.Counter, m.Tenant, m.TenantToken, m.HostToken, m.Quota, m.FreedVni,
                                         m.FreedEip, m.AuditEntry, m.EipPool, m.PrivateLineSession, m.RemovedHost,
                                         m.IdempotencyKey, m.TraceRequest})
# columns no config reads: a Core UPDATE of these alone is allowed (a port's reported status, a host's beat)
UNCOMPILED_COLUMNS: dict[str, frozenset[str]] = {"ports": frozenset({"status", "status_changed_at"}),
                                                 "hosts": frozenset({"last_seen"})}
_TABLES = {model.__table__.name: model for model in (*AFFECTS, *UNCOMPILED)}


def _labels_only(obj: Any) -> bool:
    """Only its description or tags changed: nothing any config reads."""
    changed = {a.key for a in inspect(obj).attrs if a.history.has_changes()}
    return bool(changed) and changed <= LABELS


def collect(s: Session, _ctx: UOWTransaction, _instances: object) -> None:
    """before_flush: add what the rows about to be written affect to the write's ChangeSet."""
    out: ChangeSet | None = s.info.get(CHANGES)
    if out is None:
        return
    for state, objs in (("new", s.new), ("dirty", s.dirty), ("deleted", s.deleted)):
        for obj in objs:
            if state == "dirty" and (not s.is_modified(obj) or _labels_only(obj)):
                continue
            rule = AFFECTS.get(type(obj))
            if rule is not None:
                rule(s, obj, out, state)
            elif type(obj) not in UNCOMPILED:
                raise TypeError(f"{type(obj).__name__} rows change compiled configs in ways controller/state/stamps.py "
                                "does not know: add it to AFFECTS (or UNCOMPILED)")


# table -> what a row inserted by the Core fast path affects (`WriteTxn.defer`), as AFFECTS says for its model
ROW_AFFECTS: dict[str, Callable[[dict, ChangeSet], None]] = {
    "ports": lambda r, out: out.add([r["vpc_id"]], [r.get("host")]),
    "port_security_groups": lambda r, out: None,  # inserted with their ports, which stamp the same
    "hosts": lambda r, out: (out.add(hosts=[r["name"]], topology=r.get("kind") == "gateway"),
                             out.vteps.add(r["name"])),
}


def rows_affect(table: str, rows: list[dict], out: ChangeSet) -> None:
    rule = ROW_AFFECTS.get(table)
    if rule is None:
        raise TypeError(f"deferred inserts into {table}: say in controller/state/stamps.ROW_AFFECTS what they affect")
    for r in rows:
        rule(r, out)


def guard(state: ORMExecuteState) -> None:
    """do_orm_execute: inside a write, a Core INSERT, UPDATE or DELETE on a table configs are compiled from is
    refused, unless it only sets columns no config reads: what it changes would go unstamped."""
    if CHANGES not in state.session.info or not (state.is_insert or state.is_update or state.is_delete) \
            or state.execution_options.get("tianji_stamped"):
        return
    table = getattr(state.statement, "table", None)
    name = getattr(table, "name", None)
    model = _TABLES.get(name)
    if model is None or model in UNCOMPILED:
        return
    if state.is_update:
        values = {c.key if hasattr(c, "key") else str(c) for c in state.statement._values or ()}
        if values and values <= UNCOMPILED_COLUMNS.get(name, frozenset()):
            return
    raise TypeError(f"a Core {'INSERT' if state.is_insert else 'UPDATE' if state.is_update else 'DELETE'} on "
                    f"{name} inside a write goes unstamped: change the rows through the ORM "
                    "(controller/state/stamps.py)")

