"""The table behind `Idempotency-Key`: a create's answer kept for a day, per credential and key."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Integer, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from controller.table_base import Base, now


class IdempotencyKey(Base):
    __tablename__ = "idempotency_keys"
    credential: Mapped[str] = mapped_column(String(64), primary_key=True)  # the credential's hash (Principal.key)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    request: Mapped[str] = mapped_column(String(64))  # a hash of method, path and body: a reuse must match
    status: Mapped[int | None] = mapped_column(Integer, nullable=True)  # None: still running
    body: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now, index=True)
