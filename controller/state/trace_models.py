"""Live traces: a question for one hypervisor's switch, delivered on its config stream, and its agent's answer."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime, String
from sqlalchemy.orm import Mapped, mapped_column

from controller.state.table_base import Base, new_id, now


class TraceRequest(Base):
    __tablename__ = "trace_requests"
    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    host: Mapped[str] = mapped_column(String(64), index=True)
    question: Mapped[dict[str, Any]] = mapped_column(JSON)  # {"port_id": ..., "packet": {field: value}}
    answer: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # None: not answered yet
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now, index=True)
