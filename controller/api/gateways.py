"""The gateway instances' watch: like the hosts' config watch, keyed by the global revision, answered only when
the instance's own config differs from the one it holds (its digest)."""

from __future__ import annotations

import time
from collections.abc import Callable

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import BaseModel

from controller.api.common import MAX_BIGINT, WriteRoute, db_of
from controller.auth import Principal, own_host, require_infra
from controller.errors import not_found
from controller.serving import watch_thread
from controller.southbound.gateway_compiler import GatewayCompiled, compile_gateway_sections
from controller.southbound.watch import Held, Wake, long_poll
from controller.state.reads import may_serve
from tianji.southbound import GatewayConfig, GatewayConfigDelta

router = APIRouter(tags=["gateways"], route_class=WriteRoute)
DIGEST = Query(None, max_length=64, pattern="^[0-9a-f]*$",
               description="the X-Tianji-Config-Digest of the config the instance holds (at `after`)")


@router.get("/gateways/{name}/config", response_model=GatewayConfig,
            responses={304: {"description": "no change after `after` within `timeout` seconds"}})
async def gateway_config(name: str, request: Request, after: int = Query(-1, ge=-1, le=MAX_BIGINT),
                         timeout: float = Query(0, ge=0, le=300), digest: str | None = DIGEST,
                         p: Principal = Depends(require_infra)) -> Response:
    """Long-poll for a gateway instance's whole config (NAT rules, EIPs, endpoints). With `digest`, a write that
    leaves this instance's config as it is goes unanswered (no download, no apply, no ARP on the instance), as
    if it had not happened. Stateless: any worker or replica can tell."""
    own_host(p, name, "gateway")
    return await _watch(request, name, after, timeout, digest, lambda c: c.config())


@router.get("/gateways/{name}/config/delta", response_model=GatewayConfigDelta,
            responses={304: {"description": "no change after `after` within `timeout` seconds"}})
async def gateway_config_delta(name: str, request: Request, after: int = Query(-1, ge=-1, le=MAX_BIGINT),
                               timeout: float = Query(0, ge=0, le=300), digest: str | None = DIGEST,
                               p: Principal = Depends(require_infra)) -> Response:
    """The same long-poll, answered with the sections (one per VPC) that changed after `after`
    (GatewayConfigDelta), not the whole config; `after=-1` answers every section. Gateway instances watch this
    way: a write in one of 1,000 tenants sends that tenant's section."""
    own_host(p, name, "gateway")
    return await _watch(request, name, after, timeout, digest, lambda c: c.delta(after))


async def _watch(request: Request, name: str, after: int, timeout: float, digest: str | None,
                 answer: Callable[[GatewayCompiled], BaseModel]) -> Response:
    """The instance's config answered when it differs from what the instance holds (its revision, and its digest:
    a write that leaves the config as it is is no answer). Compiled to know; a wake is relevant when it may change
    the instance's config: it stamped a VPC the instance serves, the topology, or a VPC that now has something a
    gateway serves (a new NAT gateway, an EIP on a port)."""
    db = db_of(request)
    settings = request.app.state.settings

    def compile_now() -> GatewayCompiled | None:
        with db.snapshot() as s:
            return compile_gateway_sections(s, name, settings.private_line_asn)

    def concerns(vpcs: set[str]) -> bool:
        with db.snapshot() as s:
            return may_serve(s, vpcs)

    async def look() -> Held:
        t0 = time.perf_counter()
        out = await watch_thread(compile_now)
        if out is None:
            raise not_found("gateway", name)
        # an instance ahead of this database (a restore without its epoch: controller/state/backup.py) is answered
        return Held(out.at, out.at < after or out.at > after and (after < 0 or digest != out.digest), (out, t0))

    async def may_change(w: Wake, held: Held) -> bool:
        out = held.value[0]
        if w.revision and w.revision <= out.at and not w.unknown:
            return False  # compiled already
        if w.unknown or w.topology or w.vteps or not out.universe.isdisjoint(w.vpcs):
            return True
        return bool(w.vpcs) and await watch_thread(lambda: concerns(set(w.vpcs)))

    held, changed = await long_poll(request.app.state.broadcaster, settings.watch_coalesce,
                                    time.monotonic() + min(timeout, settings.max_watch_timeout), look, may_change)
    out, t0 = held.value
    if not changed:
        return Response(status_code=304, headers={"X-Tianji-Revision": str(out.at)})
    body = answer(out).model_dump_json()
    took = (time.perf_counter() - t0) * 1000  # compile and serialise, for the instance's status
    return Response(body, media_type="application/json",
                    headers={"X-Tianji-Revision": str(out.at), "X-Tianji-Config-Digest": out.digest,
                             "Server-Timing": f"compile;dur={took:.1f}"})
