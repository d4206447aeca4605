"""The part of `Idempotency-Key` inside a write (controller/state/db.py calls it): the key inserted in the write's own
transaction, with the path of the row the write created, so that the key and the change commit together
(controller/idempotency.py says what a retry then gets)."""

from __future__ import annotations

from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, UOWTransaction
from sqlalchemy.sql import Executable

from controller import failpoints
from controller.errors import ApiError
from controller.state.idempotency_models import CLAIM, Claim, IdempotencyKey, table_of
from controller.state.stamps import CHANGES
from controller.state.table_base import now

__all__ = ["CLAIM", "note_created_resource", "take"]


def note_created_resource(s: Session, _ctx: UOWTransaction) -> None:
    """A keyed create's row (what its key will say it made, if the process dies before keeping its answer)."""
    claim = CLAIM.get()
    if claim is not None and claim.created is None and CHANGES in s.info:
        table = table_of(claim.collection)
        claim.created = next((o.id for o in s.new if o.__table__.name == table), None)


def take(s: Session, deferred: list[tuple[Executable, dict | list[dict]]], claim: Claim) -> None:
    """The request's Idempotency-Key, inserted in the transaction of the write it makes: the key and what it
    created commit together or not at all (controller/idempotency.py)."""
    if claim.created is None:
        table = table_of(claim.collection)
        rows = [r for stmt, params in deferred if stmt.table.name == table
                for r in (params if isinstance(params, list) else [params])]
        claim.created = rows[0].get("id") if rows else None
    resource = f"{claim.collection.rstrip('/')}/{claim.created}" if claim.created else None
    try:
        s.execute(insert(IdempotencyKey.__table__).values(
            credential=claim.credential, key=claim.key, request=claim.digest, created_at=now(), resource=resource))
    except IntegrityError:
        claim.lost = True
        raise ApiError(409, "a request with this Idempotency-Key ran at the same time and made its change; retry "
                            "with the same key to get its answer", "Idempotency-Key") from None
    failpoints.point("idempotency.before-commit")
