"""The private lines' tables (the rest of the schema is controller/state/models.py, which imports these)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, BigInteger, DateTime, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from controller.state.table_base import Base, new_id, now


class PrivateLine(Base):
    """A customer's dedicated line into a VPC: one 802.1Q VLAN on the gateways' handoff, with a BGP session (and
    optionally a second, on another instance: the redundant pair) between the cloud's address and the customer's."""

    __tablename__ = "private_lines"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    vpc_id: Mapped[str] = mapped_column(ForeignKey("vpcs.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    vlan_id: Mapped[int] = mapped_column(Integer, unique=True)  # one handoff: a VLAN is one line
    customer_asn: Mapped[int] = mapped_column(BigInteger)
    customer_ip: Mapped[str] = mapped_column(String(15))
    local_ip: Mapped[str] = mapped_column(String(15))
    prefixlen: Mapped[int] = mapped_column(Integer)  # 30 or 31, of both pairs
    secondary_customer_ip: Mapped[str | None] = mapped_column(String(15), nullable=True)
    secondary_local_ip: Mapped[str | None] = mapped_column(String(15), nullable=True)
    md5_password: Mapped[str | None] = mapped_column(String(80), nullable=True)
    max_prefixes: Mapped[int] = mapped_column(Integer, default=100)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)
    __table_args__ = (UniqueConstraint("vpc_id", "name", name="uq_private_line_vpc_name"),)


class PrivateLinePlacement(Base):
    """Where a session of a line runs (0: the primary, 1: the secondary): kept while that instance lives, so an
    instance coming back takes nothing back by itself (a session moved is a session down); set again when it dies,
    and from scratch by an operator's rebalance (controller/roles/line/placement.py)."""

    __tablename__ = "private_line_placements"
    line_id: Mapped[str] = mapped_column(ForeignKey("private_lines.id", ondelete="CASCADE"), primary_key=True)
    session: Mapped[int] = mapped_column(Integer, primary_key=True)
    instance: Mapped[str] = mapped_column(String(64))


class PrivateLineStaticRoute(Base):
    """A customer prefix reached over the line without BGP."""

    __tablename__ = "private_line_static_routes"
    line_id: Mapped[str] = mapped_column(ForeignKey("private_lines.id", ondelete="CASCADE"), primary_key=True)
    destination: Mapped[str] = mapped_column(String(18), primary_key=True)


class PrivateLineLearned(Base):
    """A prefix a gateway instance's BGP session of the line accepted: a route of the VPC through that instance."""

    __tablename__ = "private_line_learned"
    line_id: Mapped[str] = mapped_column(ForeignKey("private_lines.id", ondelete="CASCADE"), primary_key=True)
    instance: Mapped[str] = mapped_column(String(64), primary_key=True)
    prefix: Mapped[str] = mapped_column(String(18), primary_key=True)


class PrivateLineSession(Base):
    """A session's state as its instance last reported it (read by GET, compiled into nothing)."""

    __tablename__ = "private_line_sessions"
    line_id: Mapped[str] = mapped_column(ForeignKey("private_lines.id", ondelete="CASCADE"), primary_key=True)
    instance: Mapped[str] = mapped_column(String(64), primary_key=True)
    local_ip: Mapped[str] = mapped_column(String(15), primary_key=True)
    bgp_state: Mapped[str] = mapped_column(String(16), default="Idle")
    bfd_state: Mapped[str] = mapped_column(String(16), default="down")
    received: Mapped[int] = mapped_column(Integer, default=0)
    accepted: Mapped[int] = mapped_column(Integer, default=0)
    advertised: Mapped[int] = mapped_column(Integer, default=0)
    refused: Mapped[list] = mapped_column(JSON, default=list)  # [{prefix, reason}]
    last_error: Mapped[str | None] = mapped_column(String(255), nullable=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)
