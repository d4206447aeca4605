"""The table behind `Idempotency-Key`: a create's answer kept for a day, per credential and key; and the claim a
keyed request's write takes in its own transaction (`CLAIM`), so that the create and the key commit together."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import DateTime, Integer, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from controller.state.table_base import Base, now


class IdempotencyKey(Base):
    __tablename__ = "idempotency_keys"
    credential: Mapped[str] = mapped_column(String(64), primary_key=True)  # the credential's hash (Principal.key)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    request: Mapped[str] = mapped_column(String(64))  # a hash of method, path and body: a reuse must match
    status: Mapped[int | None] = mapped_column(Integer, nullable=True)  # None: committed, its answer not yet kept
    body: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=now, index=True)
    # what the write created (its API path), committed with it: the answer when the process died before keeping it
    resource: Mapped[str | None] = mapped_column(String(300), nullable=True)


@dataclass
class Claim:
    """A keyed request's claim, handed to the write it makes (controller/state/db.py) through `CLAIM`."""

    credential: str
    key: str
    digest: str
    collection: str  # the request's path: a create's row is found in the table of its last segment
    created: str | None = None  # the id of the first row the write inserted into that table
    taken: bool = False  # the key was committed with the write
    lost: bool = False  # another request with this key committed first


CLAIM: ContextVar[Claim | None] = ContextVar("tianji_idempotency_claim", default=None)


def table_of(path: str) -> str:
    """The table a POST to `path` creates its row in: /v1/ports -> ports, /v1/nat-gateways/X/snat-rules ->
    snat_rules (an action such as /v1/peerings/X/accept has none)."""
    return path.rstrip("/").rsplit("/", 1)[-1].replace("-", "_")
