"""Live traces (controller/reachability/live.py): a question for one hypervisor's switch goes out on its config
stream as a `trace` event; its agent answers here."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from sqlalchemy import delete, select, update

from controller.api.common import WriteRoute, db_of
from controller.auth import Principal, own_host, require_infra
from controller.errors import not_found
from controller.state import models as m
from controller.state.db import Database
from controller.state.models import now

router = APIRouter(tags=["hosts"], route_class=WriteRoute)
FRESH_S = 30.0  # a question older than this is not sent (its asker has given up)
_T = m.TraceRequest.__table__


class TraceAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    output: Annotated[str, StringConstraints(max_length=200_000)] = ""
    ofports: dict[Annotated[str, StringConstraints(max_length=64)], int] = Field(default_factory=dict,
                                                                                 max_length=100_000)
    error: Annotated[str, StringConstraints(max_length=2000)] | None = None


class TraceTaken(BaseModel):
    id: str


@router.put("/hosts/{name}/traces/{trace_id}", response_model=TraceTaken)
def answer_trace(name: str, trace_id: str, body: TraceAnswer, request: Request,
                 p: Principal = Depends(require_infra)) -> dict:
    """A hypervisor's agent answers a live trace it was sent: what `ovs-appctl ofproto/trace` printed, and its
    ports' OpenFlow numbers (to name the port a packet leaves by)."""
    own_host(p, name, "hypervisor")
    with db_of(request).engine.begin() as c:
        done = c.execute(update(_T).where(_T.c.id == trace_id, _T.c.host == name)
                         .values(answer=body.model_dump())).rowcount
    if not done:
        raise not_found("trace", trace_id)
    return {"id": trace_id}


def ask(db: Database, host: str, question: dict[str, Any], timeout: float = 8.0) -> dict[str, Any] | None:
    """Put a question to `host`'s switch and wait for its agent's answer (None: none in `timeout` seconds). The
    write's wake names the host as one with a question (`Wake.traces`): its config stream looks it up and sends it
    (controller/api/host_stream.py); no other wake costs a stream that look-up."""
    with db.engine.begin() as c:
        c.execute(delete(_T).where(_T.c.created_at < now() - timedelta(hours=1)))
    with db.write() as t:
        row = m.TraceRequest(host=host, question=question)
        t.session.add(row)
        t.changes.traces.add(host)
        t.session.flush()
        ident = row.id
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with db.engine.connect() as c:
            got = c.execute(select(_T.c.answer).where(_T.c.id == ident)).scalar()
        if got is not None:
            return got
        time.sleep(0.1)
    return None


def pending(db: Database, host: str) -> list[dict[str, Any]]:
    """The questions for `host` not answered yet (and not stale): what its stream sends."""
    with db.engine.connect() as c:
        rows = c.execute(select(_T.c.id, _T.c.question).where(
            _T.c.host == host, _T.c.answer.is_(None), _T.c.created_at > now() - timedelta(seconds=FRESH_S))).all()
    return [{"id": i, **q} for i, q in rows]
