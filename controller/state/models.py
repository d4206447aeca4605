"""SQLAlchemy models: the controller's persistent state. Uniqueness that matters for the data plane (VNI, MAC, IP
within a VPC, VTEP IP) is enforced by database constraints, so it holds across threads and controller replicas."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from controller.state.change_log import ChangeLogEntry  # noqa: F401 - every table is in `models`
from controller.state.freed_models import FreedEip, FreedVni  # noqa: F401 - likewise
from controller.state.idempotency_models import IdempotencyKey  # noqa: F401 - likewise
from controller.state.lb_models import (  # noqa: F401 - likewise
    LbHealthMonitor,
    LbListener,
    LbMember,
    LbPool,
    LoadBalancer,
)
from controller.state.line_models import (  # noqa: F401 - every table is in `models` (m.PrivateLine, the metadata)
    PrivateLine,
    PrivateLineLearned,
    PrivateLinePlacement,
    PrivateLineSession,
    PrivateLineStaticRoute,
)
from controller.state.service_models import Service, ServiceEndpoint  # noqa: F401 - likewise
from controller.state.table_base import Base, Labelled, new_id, now
from controller.state.trace_models import TraceRequest  # noqa: F401 - likewise


class Counter(Base):
    """Named counters: `revision` (every write), `topology` (what others compile of a host changed: its VTEP entry,
    a gateway's role or liveness) and `vteps` (the VTEP list alone)."""

    __tablename__ = "counters"
    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, default=0)


class ClusterSetting(Base):
    """What every controller replica shares (the admin credential's hash): one row per setting."""

    __tablename__ = "cluster_settings"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class Tenant(Base):
    __tablename__ = "tenants"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)


class TenantToken(Base):
    """A tenant's credentials: several at once, so that one can be rotated in before the old is revoked."""

    __tablename__ = "tenant_tokens"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(64), default="")
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)


class HostToken(Base):
    """Infrastructure credentials. A host token names one host and its kind (`hypervisor`, `gateway`): with it,
    that host registers itself, beats, reports its ports and reads its config, and nothing else. An
    `orchestrator` token (no host) binds tenants' ports to hosts. Tokens made before hosts were named in them
    (`host` NULL, kind `hypervisor`) are refused: the operator makes one per host."""

    __tablename__ = "host_tokens"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    host: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    kind: Mapped[str] = mapped_column(String(16), default="hypervisor")
    # a gateway credential's role (nat, lb): its host registers with that role only; NULL (credentials made
    # before roles were bound): the role its host was first registered with
    role: Mapped[str | None] = mapped_column(String(16), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)


class Quota(Base):
    """A tenant's limit on one kind of resource, where the admin set one (otherwise the settings' default)."""

    __tablename__ = "quotas"
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True)
    resource: Mapped[str] = mapped_column(String(32), primary_key=True)
    limit: Mapped[int] = mapped_column(Integer)


class AuditEntry(Base):
    """Every write through the API that committed: who, what, when, and the revision it made (written in the
    write's own transaction, so there is no write without its entry and no entry without its write)."""

    __tablename__ = "audit_log"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
                                    autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now, index=True)
    actor_kind: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(64))
    tenant_id: Mapped[str | None] = mapped_column(String(36), nullable=True, index=True)
    method: Mapped[str] = mapped_column(String(8))
    path: Mapped[str] = mapped_column(String(255))
    revision: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class Host(Base):
    __tablename__ = "hosts"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    vtep_ip: Mapped[str] = mapped_column(String(15), unique=True)
    kind: Mapped[str] = mapped_column(String(16), default="hypervisor")
    status: Mapped[str] = mapped_column(String(8), default="up")
    role: Mapped[str | None] = mapped_column(String(16), nullable=True)  # a gateway's (None: nat): GATEWAY_ROLES
    last_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)
    registered_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)
    # Global revision of the last change to the set of ports bound here.
    config_revision: Mapped[int] = mapped_column(BigInteger, default=0)
    # revision of the last change to its VTEP entry (name, address, kind): what other hosts' deltas carry
    vtep_revision: Mapped[int] = mapped_column(BigInteger, server_default="0", index=True)


class RemovedHost(Base):
    """A deleted host's VTEP entry as a removal at its revision, for deltas (registering the name again clears it)."""

    __tablename__ = "removed_hosts"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    revision: Mapped[int] = mapped_column(BigInteger, index=True)


class Vpc(Labelled, Base):
    __tablename__ = "vpcs"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    cidr: Mapped[str] = mapped_column(String(18))
    # dual-stack: a /56 from the operator's pools (unique in the cloud) or given (outside them); None: IPv4 only
    ipv6_cidr: Mapped[str | None] = mapped_column(String(43), nullable=True, index=True)
    vni: Mapped[int] = mapped_column(Integer, unique=True)
    router_mac: Mapped[str] = mapped_column(String(17))
    mtu: Mapped[int] = mapped_column(Integer, default=1450, server_default="1450")  # what DHCP gives its VMs
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)
    # Global revision of the last change to anything inside this VPC (subnets, ports, SGs, routes, peerings).
    revision: Mapped[int] = mapped_column(BigInteger, default=0, index=True)

    subnets: Mapped[list[Subnet]] = relationship(back_populates="vpc", order_by="Subnet.cidr")
    __table_args__ = (UniqueConstraint("tenant_id", "name", name="uq_vpc_tenant_name"),)


class Subnet(Labelled, Base):
    __tablename__ = "subnets"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    vpc_id: Mapped[str] = mapped_column(ForeignKey("vpcs.id"), index=True)
    tenant_id: Mapped[str] = mapped_column(String(36), index=True)
    name: Mapped[str] = mapped_column(String(64))
    cidr: Mapped[str] = mapped_column(String(18))
    gateway_ip: Mapped[str] = mapped_column(String(15))
    ipv6_cidr: Mapped[str | None] = mapped_column(String(43), nullable=True)  # a /64 of its VPC's
    ipv6_gateway_ip: Mapped[str | None] = mapped_column(String(39), nullable=True)  # the router: the /64's ::1
    ipv6_address_mode: Mapped[str | None] = mapped_column(String(16), nullable=True)  # slaac | dhcpv6-stateful
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)

    vpc: Mapped[Vpc] = relationship(back_populates="subnets")
    __table_args__ = (UniqueConstraint("vpc_id", "cidr", name="uq_subnet_vpc_cidr"),)


class SecurityGroup(Labelled, Base):
    __tablename__ = "security_groups"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    vpc_id: Mapped[str] = mapped_column(ForeignKey("vpcs.id"), index=True)
    tenant_id: Mapped[str] = mapped_column(String(36), index=True)
    name: Mapped[str] = mapped_column(String(64))
    is_default: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)

    rules: Mapped[list[SecurityGroupRule]] = relationship(
        back_populates="group",
        foreign_keys="SecurityGroupRule.group_id",
        order_by="SecurityGroupRule.id",
        cascade="all, delete-orphan",
    )
    __table_args__ = (UniqueConstraint("vpc_id", "name", name="uq_sg_vpc_name"),)


class SecurityGroupRule(Base):
    """A stateful rule. Its integer id is stamped into conntrack entries by the vSwitch (ct_mark/ct_label),
    which is how removing the rule also cuts the connections it allowed."""

    __tablename__ = "security_group_rules"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    group_id: Mapped[str] = mapped_column(ForeignKey("security_groups.id", ondelete="CASCADE"), index=True)
    direction: Mapped[str] = mapped_column(String(8))
    protocol: Mapped[str] = mapped_column(String(8))
    ethertype: Mapped[str] = mapped_column(String(4), default="IPv4", server_default="IPv4")
    port_range_min: Mapped[int | None] = mapped_column(Integer, nullable=True)
    port_range_max: Mapped[int | None] = mapped_column(Integer, nullable=True)
    remote_cidr: Mapped[str | None] = mapped_column(String(43), nullable=True)
    remote_group_id: Mapped[str | None] = mapped_column(
        ForeignKey("security_groups.id", ondelete="RESTRICT"), nullable=True, index=True
    )
    description: Mapped[str] = mapped_column(String(255), default="")

    group: Mapped[SecurityGroup] = relationship(back_populates="rules", foreign_keys=[group_id])


class Port(Labelled, Base):
    __tablename__ = "ports"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(String(36), index=True)
    vpc_id: Mapped[str] = mapped_column(ForeignKey("vpcs.id"), index=True)
    subnet_id: Mapped[str] = mapped_column(ForeignKey("subnets.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    ip: Mapped[str] = mapped_column(String(15))
    ip_int: Mapped[int] = mapped_column(BigInteger)
    ipv6: Mapped[str | None] = mapped_column(String(39), nullable=True)  # compressed: one spelling per address
    mac: Mapped[str] = mapped_column(String(17), index=True)
    host: Mapped[str | None] = mapped_column(ForeignKey("hosts.name"), nullable=True, index=True)
    # a live migration's destination: bound there too (its flows in, traffic sent to both) until `host` moves;
    # indexed: a host's reads ask `host = :h OR migrating_to = :h`, which an index on `host` alone cannot serve
    migrating_to: Mapped[str | None] = mapped_column(ForeignKey("hosts.name"), nullable=True, index=True)
    status: Mapped[str] = mapped_column(String(8), default="DOWN")
    status_changed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)  # as reported
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)

    groups: Mapped[list[SecurityGroup]] = relationship(secondary="port_security_groups", order_by="SecurityGroup.id")
    # a MAC is unique in its VPC (its L2 domain), not across tenants: one tenant must not probe another's MACs
    __table_args__ = (UniqueConstraint("vpc_id", "ip_int", name="uq_port_vpc_ip"),
                      UniqueConstraint("vpc_id", "mac", name="uq_port_vpc_mac"),
                      UniqueConstraint("vpc_id", "ipv6", name="uq_port_vpc_ipv6"))


class PortSecurityGroup(Base):
    __tablename__ = "port_security_groups"
    port_id: Mapped[str] = mapped_column(ForeignKey("ports.id", ondelete="CASCADE"), primary_key=True)
    group_id: Mapped[str] = mapped_column(ForeignKey("security_groups.id"), primary_key=True, index=True)


class Peering(Base):
    __tablename__ = "peerings"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    requester_vpc_id: Mapped[str] = mapped_column(ForeignKey("vpcs.id"), index=True)
    accepter_vpc_id: Mapped[str] = mapped_column(ForeignKey("vpcs.id"), index=True)
    requester_tenant_id: Mapped[str] = mapped_column(String(36), index=True)
    accepter_tenant_id: Mapped[str] = mapped_column(String(36), index=True)
    # The pair in a canonical order, so A->B and B->A cannot both exist.
    vpc_low: Mapped[str] = mapped_column(String(36))
    vpc_high: Mapped[str] = mapped_column(String(36))
    status: Mapped[str] = mapped_column(String(24))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)
    __table_args__ = (UniqueConstraint("vpc_low", "vpc_high", name="uq_peering_pair"),)


class Route(Base):
    __tablename__ = "routes"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    vpc_id: Mapped[str] = mapped_column(ForeignKey("vpcs.id"), index=True)
    tenant_id: Mapped[str] = mapped_column(String(36), index=True)
    destination: Mapped[str] = mapped_column(String(43))
    target_type: Mapped[str] = mapped_column(String(24))
    target_id: Mapped[str] = mapped_column(String(36), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)
    __table_args__ = (UniqueConstraint("vpc_id", "destination", name="uq_route_vpc_dest"),)


class EipPool(Base):
    """Public addresses the operator lends to tenants (admin-configured)."""

    __tablename__ = "eip_pools"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    cidr: Mapped[str] = mapped_column(String(18), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)


class Eip(Base):
    __tablename__ = "eips"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    pool_id: Mapped[str] = mapped_column(ForeignKey("eip_pools.id"), index=True)
    address: Mapped[str] = mapped_column(String(15), unique=True)
    port_id: Mapped[str | None] = mapped_column(ForeignKey("ports.id"), nullable=True, unique=True)
    home: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)  # gateway instance
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)


class NatGateway(Base):
    __tablename__ = "nat_gateways"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(String(36), index=True)
    vpc_id: Mapped[str] = mapped_column(ForeignKey("vpcs.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)
    __table_args__ = (UniqueConstraint("vpc_id", "name", name="uq_natgw_vpc_name"),)


class NatGatewayEip(Base):
    __tablename__ = "nat_gateway_eips"
    nat_gateway_id: Mapped[str] = mapped_column(ForeignKey("nat_gateways.id", ondelete="CASCADE"), primary_key=True)
    eip_id: Mapped[str] = mapped_column(ForeignKey("eips.id"), primary_key=True, unique=True)


class SnatRule(Base):
    __tablename__ = "snat_rules"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    nat_gateway_id: Mapped[str] = mapped_column(ForeignKey("nat_gateways.id", ondelete="CASCADE"), index=True)
    subnet_id: Mapped[str | None] = mapped_column(ForeignKey("subnets.id"), nullable=True)
    cidr: Mapped[str] = mapped_column(String(18))
    __table_args__ = (UniqueConstraint("nat_gateway_id", "cidr", name="uq_snat_gw_cidr"),)


class SnatRuleEip(Base):
    """An SNAT rule's EIPs, in order (paired pooling hashes over the list), each once."""

    __tablename__ = "snat_rule_eips"
    rule_id: Mapped[str] = mapped_column(ForeignKey("snat_rules.id", ondelete="CASCADE"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    eip_id: Mapped[str] = mapped_column(ForeignKey("eips.id"), index=True)
    __table_args__ = (UniqueConstraint("rule_id", "eip_id", name="uq_snat_rule_eip"),)


class DnatRule(Base):
    __tablename__ = "dnat_rules"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    nat_gateway_id: Mapped[str] = mapped_column(ForeignKey("nat_gateways.id", ondelete="CASCADE"), index=True)
    eip_id: Mapped[str] = mapped_column(ForeignKey("eips.id"), index=True)
    protocol: Mapped[str] = mapped_column(String(4))
    external_port: Mapped[int] = mapped_column(Integer)
    port_id: Mapped[str] = mapped_column(ForeignKey("ports.id"), index=True)
    internal_port: Mapped[int] = mapped_column(Integer)
    __table_args__ = (UniqueConstraint("eip_id", "protocol", "external_port", name="uq_dnat_eip_proto_port"),)
