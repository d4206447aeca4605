"""What was freed and when: identifiers handed out again only after a while (controller/api/vpcs.py, api/nat.py)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from controller.state.table_base import Base, now


class FreedVni(Base):
    """A VNI whose VPC was deleted: not handed out again for a while (an agent may still hold its flows)."""

    __tablename__ = "freed_vnis"
    vni: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    freed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)


class FreedEip(Base):
    """An EIP's address after its release: handed out again last (servers may hold its old connections)."""

    __tablename__ = "freed_eips"
    address: Mapped[str] = mapped_column(String(15), primary_key=True)
    freed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now)
