"""The services' tables: what lives outside every VPC and is reached through an endpoint in the consumer's subnet
(the rest of the schema is controller/state/models.py, which imports these)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Boolean, DateTime, ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from controller.state.table_base import Base, new_id, now


class Service(Base):
    """A service tenants reach through endpoints: the operator's (addresses on the service network: the cluster's
    store, a database) or a tenant's own load balancer published to the tenants it names (PrivateLink's provider)."""

    __tablename__ = "services"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(63), unique=True)  # a DNS label: <name>.<vpc>.internal
    tenant_id: Mapped[str | None] = mapped_column(ForeignKey("tenants.id"), nullable=True, index=True)  # the owner
    addresses: Mapped[list] = mapped_column(JSON, default=list)  # the operator's, on the service network
    ports: Mapped[list] = mapped_column(JSON, default=list)  # [{"protocol", "port"}]
    proxy_protocol: Mapped[bool] = mapped_column(Boolean, default=False)  # v2 header with the endpoint's id
    load_balancer_id: Mapped[str | None] = mapped_column(ForeignKey("load_balancers.id"), nullable=True, unique=True)
    allowed_tenants: Mapped[list | None] = mapped_column(JSON, nullable=True)  # None: every tenant
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)


class ServiceEndpoint(Base):
    """A service's address in a consumer's subnet (held by a port of its own: IPAM, the VPC's uniqueness rules and
    its security groups apply as to any port), one per service and VPC."""

    __tablename__ = "service_endpoints"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    vpc_id: Mapped[str] = mapped_column(ForeignKey("vpcs.id"), index=True)
    subnet_id: Mapped[str] = mapped_column(ForeignKey("subnets.id"), index=True)
    service_id: Mapped[str] = mapped_column(ForeignKey("services.id"), index=True)
    port_id: Mapped[str] = mapped_column(ForeignKey("ports.id"), unique=True)
    address: Mapped[str] = mapped_column(String(15))
    dns_name: Mapped[str] = mapped_column(String(253))
    # the source the service sees: its own address on the service network (TIANJI_SERVICE_SOURCE_POOL), or for a
    # published load balancer the address of a port of its own in the provider's VPC (provider_port_id)
    source_address: Mapped[str | None] = mapped_column(String(15), nullable=True, unique=True)
    provider_port_id: Mapped[str | None] = mapped_column(ForeignKey("ports.id"), nullable=True, unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)
    __table_args__ = (UniqueConstraint("vpc_id", "service_id", name="uq_endpoint_vpc_service"),)


def may_use(owner: str | None, allowed: list | None, tenant: str) -> bool:
    """Whether a tenant may reach a service: its own, one shared with every tenant (the operator's without a list),
    or one whose list names it (the API's check, and the data path's: an endpoint of a tenant no longer allowed
    carries nothing)."""
    return owner == tenant or (allowed is None and owner is None) or tenant in (allowed or [])

