"""The gateway instances' watch: like the hosts' config watch, keyed by the global revision."""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from controller.api.common import db_of
from controller.auth import Principal, require_infra
from controller.compiler import compile_gateway
from controller.errors import not_found
from controller.hostconfig import GatewayConfig

router = APIRouter(tags=["gateways"])


@router.get("/gateways/{name}/config", response_model=GatewayConfig,
            responses={304: {"description": "no change after `after` within `timeout` seconds"}})
async def gateway_config(name: str, request: Request, after: int = Query(-1, ge=-1),
                         timeout: float = Query(0, ge=0, le=300), _: Principal = Depends(require_infra)) -> Response:
    """Long-poll for a gateway instance's config (NAT rules, EIPs, endpoints). Gateways are few: they follow
    the global revision and recompile on any write."""
    db = db_of(request)
    bc = request.app.state.broadcaster
    q = bc.subscribe()
    try:
        rev = await run_in_threadpool(db.revision)
        deadline = time.monotonic() + min(timeout, request.app.state.settings.max_watch_timeout)
        while rev <= after:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return Response(status_code=304, headers={"X-Tianji-Revision": str(rev)})
            try:
                await asyncio.wait_for(q.get(), remaining)
            except TimeoutError:
                continue
            rev = await run_in_threadpool(db.revision)
    finally:
        bc.unsubscribe(q)

    def build() -> GatewayConfig | None:
        with db.snapshot() as s:
            return compile_gateway(s, name, rev)

    cfg = await run_in_threadpool(build)
    if cfg is None:
        raise not_found("gateway", name)
    return Response(cfg.model_dump_json(), media_type="application/json", headers={"X-Tianji-Revision": str(rev)})
