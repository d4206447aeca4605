"""The load balancers' tables: a VIP with its listeners, pools, members and health monitors (the rest of the schema
is controller/state/models.py, which imports these)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Float, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from controller.state.table_base import Base, new_id, now


class LoadBalancer(Base):
    """A virtual IP in a subnet (held by a port of its own, so IPAM and the VPC's uniqueness rules apply), optionally
    reachable from the internet through an EIP."""

    __tablename__ = "load_balancers"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(String(36), index=True)
    vpc_id: Mapped[str] = mapped_column(ForeignKey("vpcs.id"), index=True)
    subnet_id: Mapped[str] = mapped_column(ForeignKey("subnets.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    vip_port_id: Mapped[str] = mapped_column(ForeignKey("ports.id"), unique=True)
    vip_address: Mapped[str] = mapped_column(String(15))
    eip_id: Mapped[str | None] = mapped_column(ForeignKey("eips.id"), nullable=True, unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)
    __table_args__ = (UniqueConstraint("vpc_id", "name", name="uq_lb_vpc_name"),)


class LbListener(Base):
    __tablename__ = "lb_listeners"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(String(36), index=True)
    load_balancer_id: Mapped[str] = mapped_column(ForeignKey("load_balancers.id", ondelete="CASCADE"), index=True)
    protocol: Mapped[str] = mapped_column(String(4))
    port: Mapped[int] = mapped_column(Integer)
    default_pool_id: Mapped[str | None] = mapped_column(ForeignKey("lb_pools.id"), nullable=True, index=True)
    idle_timeout_s: Mapped[int] = mapped_column(Integer, default=350)
    __table_args__ = (UniqueConstraint("load_balancer_id", "protocol", "port", name="uq_listener_lb_proto_port"),)


class LbPool(Base):
    __tablename__ = "lb_pools"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(String(36), index=True)
    load_balancer_id: Mapped[str] = mapped_column(ForeignKey("load_balancers.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    protocol: Mapped[str] = mapped_column(String(4))
    algorithm: Mapped[str] = mapped_column(String(16), default="maglev")
    table_size: Mapped[int] = mapped_column(Integer, default=65537)  # Maglev's M: a prime
    deregistration_delay_s: Mapped[int] = mapped_column(Integer, default=30)
    __table_args__ = (UniqueConstraint("load_balancer_id", "name", name="uq_pool_lb_name"),)


class LbMember(Base):
    __tablename__ = "lb_members"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(String(36), index=True)
    pool_id: Mapped[str] = mapped_column(ForeignKey("lb_pools.id", ondelete="CASCADE"), index=True)
    port_id: Mapped[str] = mapped_column(ForeignKey("ports.id"), index=True)
    protocol_port: Mapped[int] = mapped_column(Integer)
    weight: Mapped[int] = mapped_column(Integer, default=1)  # 0: draining
    operating_status: Mapped[str] = mapped_column(String(12), default="NO_MONITOR")
    status_changed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)
    __table_args__ = (UniqueConstraint("pool_id", "port_id", "protocol_port", name="uq_member_pool_port"),)


class LbHealthMonitor(Base):
    __tablename__ = "lb_health_monitors"
    pool_id: Mapped[str] = mapped_column(ForeignKey("lb_pools.id", ondelete="CASCADE"), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(String(36), index=True)
    type: Mapped[str] = mapped_column(String(12))
    interval_s: Mapped[float] = mapped_column(Float)
    timeout_s: Mapped[float] = mapped_column(Float)
    rise: Mapped[int] = mapped_column(Integer)
    fall: Mapped[int] = mapped_column(Integer)
    http_method: Mapped[str | None] = mapped_column(String(8), nullable=True)
    url_path: Mapped[str | None] = mapped_column(String(255), nullable=True)
    expected_codes: Mapped[str | None] = mapped_column(String(64), nullable=True)


