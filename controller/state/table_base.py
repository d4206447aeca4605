"""The declarative base every table is defined on, and the defaults of their ids and times."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import JSON, String, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def new_id() -> str:
    return str(uuid.uuid4())


def now() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class Labelled:
    """What a person writes on a resource to find it again (no config reads it, so changing it stamps nothing:
    controller/state/stamps.py LABELS): a description, and tags (a JSON list of strings) that lists filter on."""

    description: Mapped[str] = mapped_column(String(255), default="", server_default="")
    tags: Mapped[list[str]] = mapped_column(JSON, default=list, server_default=text("'[]'"))


LABELS = frozenset({"description", "tags"})
