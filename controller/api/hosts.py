"""Hosts (hypervisors and gateways): registration, heartbeat/status, and the config watch."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable
from typing import Literal, NamedTuple

from fastapi import APIRouter, Depends, Query, Request, Response
from sqlalchemy import bindparam, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from controller.api.common import MAX_BIGINT, WriteRoute, db_of, one_hop
from controller.api.host_schemas import HostOut, HostRegister, HostUpdate
from controller.api.ops_schemas import HostStatusAnswer
from controller.auth import Principal, own_host, require_admin, require_infra
from controller.errors import ApiError, conflict, invalid, not_found
from controller.roles.line.placement import instance_changed
from controller.roles.line.sections import LINE_ROLE
from controller.serving import watch_thread
from controller.southbound.compiler import compile_host
from controller.southbound.host_deltas import compile_host_delta
from controller.southbound.liveness import beat_pace
from controller.southbound.watch import Held, Wake, long_poll
from controller.state import models as m
from controller.state.db import Database
from controller.state.models import now
from controller.state.reads import host_revision
from tianji.southbound import DEFAULT_GATEWAY_ROLE, HostConfig, HostConfigDelta, PortStatusReport

router = APIRouter(tags=["hosts"], route_class=WriteRoute)


class AgentReport(NamedTuple):
    """What a host's agent said of itself in its last beat to this process."""

    revision_applied: int | None
    at: float
    errors: int | None
    last_error: str | None


def host_out(s, h: m.Host, n: int | None = None, reports: dict | None = None) -> HostOut:
    if n is None:
        n = s.execute(select(func.count()).select_from(m.Port).where(m.Port.host == h.name)).scalar()
    r = (reports or {}).get(h.name)
    return HostOut(name=h.name, vtep_ip=h.vtep_ip, kind=h.kind, role=h.role, status=h.status,
                   last_seen=h.last_seen.isoformat(), ports=n,
                   **({} if r is None else {"revision_applied": r.revision_applied, "reported_at": r.at,
                                            "agent_errors": r.errors, "last_error": r.last_error}))


@router.post("/hosts", response_model=HostOut)
def register_host(body: HostRegister, request: Request, p: Principal = Depends(require_infra)) -> HostOut:
    """Idempotent: an agent registers on every start. A host token registers its own host only, as the kind its
    token names; it cannot move an existing host's VTEP (every hypervisor would tunnel that host's traffic to the
    new address): the admin does that (`PATCH /v1/hosts/{name}`), or registers it."""
    own_host(p, body.name, body.kind)
    if body.role is not None and body.kind != "gateway":
        raise ApiError(422, "role: only a gateway has a role (nat, lb, private-line or service)", "role")
    role = (body.role or p.host_role or DEFAULT_GATEWAY_ROLE) if body.kind == "gateway" else None
    if p.host_role is not None and role != p.host_role:
        raise ApiError(403, f"role: this credential is for a {p.host_role} gateway; the operator makes one for "
                            f"another role (POST /v1/host-tokens {{\"kind\": \"gateway\", \"role\": ...}})", "role")
    db = db_of(request)
    with db.read() as s:
        h = s.get(m.Host, body.name)
        if h is not None and h.status in LIVE and (h.vtep_ip, h.kind, h.role) == (body.vtep_ip, body.kind, role):
            request.app.state.beats.note(body.name)  # an agent restarting: nothing changes but its beat
            return host_out(s, h)
    # a new host only inserts its row: its write takes the revision last (Database.write), so a thousand agents
    # booting at once do not queue on the revision while each of their transactions waits for this process
    if h is None and role != LINE_ROLE:  # a private-line instance may place sessions: stamps VPCs (not concurrent)
        try:
            with db.write(concurrent=True) as t:
                return _register(t.session, body, role, p)
        except IntegrityError:
            pass  # another registration of it (an agent's retry) inserted it first, or took its VTEP: judged below
    with db.write() as t:
        return _register(t.session, body, role, p)


def _register(s: Session, body: HostRegister, role: str | None, p: Principal) -> HostOut:
    h = s.get(m.Host, body.name)
    if h is not None and h.kind == "gateway" and h.role != role and not p.is_admin:
        raise ApiError(403, f"role: host {body.name} is registered as a {h.role} gateway; a role change is the "
                            f"operator's (PATCH /v1/hosts/{body.name} {{\"role\": \"{role}\"}})", "role")
    if h is not None and h.kind != body.kind:
        raise conflict("kind", f"host {body.name} is registered as a {h.kind}; delete it first to register it "
                               f"as a {body.kind}")
    if h is not None and h.vtep_ip != body.vtep_ip and not p.is_admin:
        raise ApiError(403, f"host {body.name} is registered with VTEP {h.vtep_ip}; a host token cannot move it "
                            f"to {body.vtep_ip}: the operator allows it with PATCH /v1/hosts/{body.name} "
                            '{"vtep_ip": ...}', "vtep_ip")
    clash = s.execute(select(m.Host.name).where(m.Host.vtep_ip == body.vtep_ip,
                                                m.Host.name != body.name)).scalar_one_or_none()
    if clash:
        raise conflict("vtep_ip", f"VTEP {body.vtep_ip} is already registered by host {clash}")
    if h is None or h.vtep_ip != body.vtep_ip:
        not_public(s, body.vtep_ip)
    was_line = h is not None and h.role == LINE_ROLE
    if h is None:
        h = m.Host(name=body.name, vtep_ip=body.vtep_ip, kind=body.kind, role=role, status="up", last_seen=now())
        s.add(h)
    else:
        status = DRAINING if h.status == DRAINING else "up"  # drained until the operator says, restarts or not
        h.vtep_ip, h.kind, h.role, h.status, h.last_seen = body.vtep_ip, body.kind, role, status, now()
    s.flush()
    instance_changed(s, h.name, h, was_line)
    return host_out(s, h)


def not_public(s: Session, vtep: str) -> None:
    """A host's VTEP is never a public address: EIP pools and the underlay are apart (api/eip_pools.py checks a
    new pool against the VTEPs)."""
    ip = ipaddress.IPv4Address(vtep)
    for cidr in s.execute(select(m.EipPool.cidr)).scalars():
        if ip in ipaddress.IPv4Network(cidr):
            raise conflict("vtep_ip", f"VTEP {vtep} is in the EIP pool {cidr}: public addresses are tenants' EIPs")


@router.get("/hosts", response_model=list[HostOut])
def list_hosts(request: Request, p: Principal = Depends(require_infra)) -> list[HostOut]:
    """Every host for the admin and orchestrators (they place VMs); a host token sees its own host."""
    with db_of(request).read() as s:
        stmt = select(m.Host).order_by(m.Host.name)
        if p.kind == "host":
            stmt = stmt.where(m.Host.name == p.host)
        counts = dict(s.execute(select(m.Port.host, func.count()).where(m.Port.host.is_not(None))
                                .group_by(m.Port.host)).all())
        reports = request.app.state.reports
        return [host_out(s, h, counts.get(h.name, 0), reports) for h in s.execute(stmt).scalars()]


@router.get("/hosts/{name}", response_model=HostOut)
def get_host(name: str, request: Request, p: Principal = Depends(require_infra)) -> HostOut:
    if p.kind == "host":
        own_host(p, name)
    with db_of(request).read() as s:
        h = s.get(m.Host, name)
        if h is None:
            raise not_found("host", name)
        return host_out(s, h, reports=request.app.state.reports)


@router.patch("/hosts/{name}", response_model=HostOut)
def update_host(name: str, body: HostUpdate, request: Request, _: Principal = Depends(require_admin)) -> HostOut:
    """The operator moves a host's VTEP (a re-addressed underlay; its agent then registers with the new one), or
    changes a gateway's role (its instance then registers with the new one)."""
    with db_of(request).write() as t:
        s = t.session
        h = s.get(m.Host, name)
        if h is None:
            raise not_found("host", name)
        if body.vtep_ip is not None and body.vtep_ip != h.vtep_ip:
            clash = s.execute(select(m.Host.name).where(m.Host.vtep_ip == body.vtep_ip,
                                                        m.Host.name != name)).scalar_one_or_none()
            if clash:
                raise conflict("vtep_ip", f"VTEP {body.vtep_ip} is already registered by host {clash}")
            not_public(s, body.vtep_ip)
            h.vtep_ip = body.vtep_ip
        if body.role is not None and body.role != h.role:
            if h.kind != "gateway":
                raise invalid("role", f"host {name} is a {h.kind}: only a gateway has a role")
            was_line, h.role = h.role == LINE_ROLE, body.role
            s.flush()
            instance_changed(s, name, h, was_line)
        s.flush()
        return host_out(s, h)


@router.post("/hosts/{name}/drain", response_model=HostOut)
def drain_host(name: str, request: Request, _: Principal = Depends(require_admin)) -> HostOut:
    """The operator moves a gateway instance's traffic to the other instances of its role before stopping it (an
    upgrade, maintenance): it is left out of every placement as if it were down (EIP homes, the hypervisors' ECMP
    choices, private-line sessions, service endpoints) while it runs on, so nothing is lost when it stops. It stays
    drained across restarts until `DELETE /v1/hosts/{name}/drain`."""
    return _set_drained(request, name, True)


@router.delete("/hosts/{name}/drain", response_model=HostOut)
def undrain_host(name: str, request: Request, _: Principal = Depends(require_admin)) -> HostOut:
    """The instance takes traffic again (once it beats: a silent one is marked down). Private-line sessions stay
    where they run until `POST /v1/private-lines/{id}/rebalance`."""
    return _set_drained(request, name, False)


def _set_drained(request: Request, name: str, drained: bool) -> HostOut:
    with db_of(request).write() as t:
        h = t.session.get(m.Host, name)
        if h is None:
            raise not_found("host", name)
        if h.kind != "gateway":
            raise conflict("name", f"host {name} is a {h.kind}: only a gateway instance is drained (a "
                                   "hypervisor's VMs move by migration: PATCH /v1/ports/ID {\"migrating_to\": ...})")
        want = DRAINING if drained else "up"
        if (h.status == DRAINING) != drained:
            h.status = want  # through the ORM: stamps the topology, so every host and instance hears of it
            t.session.flush()
            instance_changed(t.session, name, h)
        return host_out(t.session, h)


@router.delete("/hosts/{name}", status_code=204)
def delete_host(name: str, request: Request, _: Principal = Depends(require_admin)) -> None:
    with db_of(request).write() as t:
        h = t.session.get(m.Host, name)
        if h is None:
            raise not_found("host", name)
        n = t.session.execute(select(func.count()).select_from(m.Port).where(m.Port.host == name)).scalar()
        if n:
            raise conflict(None, f"host {name} still has {n} bound port(s); rebind them first")
        n = t.session.execute(select(func.count()).select_from(m.Port).where(m.Port.migrating_to == name)).scalar()
        if n:
            raise conflict(None, f"{n} port(s) are migrating to host {name}; finish or abandon those migrations "
                                 "(PATCH /v1/ports/ID with host or migrating_to: null) first")
        was_line = h.kind == "gateway" and h.role == LINE_ROLE
        t.session.delete(h)
        t.session.flush()
        instance_changed(t.session, name, None, was_line)
    request.app.state.reports.pop(name, None)


_HOSTS, _PORTS = m.Host.__table__, m.Port.__table__
DRAINING = "draining"  # a gateway instance the operator took out of placement; it runs, beats and stays so
LIVE = ("up", DRAINING)  # statuses of a host that beats: a beat brings back only a down one
Q_LIVENESS = select(_HOSTS.c.status, _HOSTS.c.kind).where(_HOSTS.c.name == bindparam("host"))
Q_PORT_STATUS = select(_PORTS.c.id, _PORTS.c.status).where(_PORTS.c.host == bindparam("host"))


@router.post("/hosts/{name}/status", response_model=HostStatusAnswer)
@one_hop
def host_status(name: str, body: PortStatusReport, request: Request,
                p: Principal = Depends(require_infra)) -> dict:
    """Heartbeat plus port UP/DOWN reports. Only a change of state is a write that bumps the revision.

    A thousand agents' reports and every gateway's beat (10 a second each) come here, so a beat that changes
    nothing must cost little: one read, and its `last_seen` noted in memory, written with every other host's at
    the next liveness tick (controller/southbound/liveness.py); one thread hop (`one_hop`)."""
    own_host(p, name)
    if body.revision_applied is not None or body.errors is not None:
        request.app.state.reports[name] = AgentReport(body.revision_applied, time.time(), body.errors,
                                                      body.last_error)
    db = db_of(request)
    with db.read(single=True) as s:  # no snapshot needed: a status that changes meanwhile is seen next beat
        h = s.execute(Q_LIVENESS, {"host": name}).one_or_none()
        if h is None:
            raise not_found("host", name)
        current = dict(s.execute(Q_PORT_STATUS, {"host": name}).all()) if body.ports else {}
    changed = {pid: st for pid, st in body.ports.items() if pid in current and current[pid] != st}
    if h.status not in LIVE or changed:
        with db.write() as t:
            if h.status not in LIVE:  # through the ORM: its coming back stamps the topology (stamps.py)
                if (host := t.session.get(m.Host, name)) is not None:
                    host.status = "up"
                    instance_changed(t.session, name, host)
            t.session.execute(update(_HOSTS).where(_HOSTS.c.name == name).values(last_seen=now()))
            for st in ("UP", "DOWN"):
                if ids := [pid for pid, v in changed.items() if v == st]:
                    t.session.execute(update(_PORTS).where(_PORTS.c.host == name, _PORTS.c.id.in_(ids))
                                      .values(status=st, status_changed_at=now()))
    else:
        request.app.state.beats.note(name)
    return {"host": name, "updated_ports": len(changed), "ignored_ports": sorted(set(body.ports) - set(current)),
            "beat_every": beat_pace(request.app.state.settings, h.kind)}


@router.get("/hosts/{name}/config", response_model=HostConfig,
            responses={304: {"description": "no change after `after` within `timeout` seconds"}})
async def watch_config(name: str, request: Request, after: int = Query(-1, ge=-1, le=MAX_BIGINT),
                       timeout: float = Query(0, ge=0, le=300),
                       p: Principal = Depends(require_infra)) -> Response:
    """Long-poll: the host's compiled config as soon as its revision is newer than `after`, or 304 after
    `timeout` seconds. Agents loop on this with `after` = the revision they last applied."""
    own_host(p, name, "hypervisor")
    return await _watch(request, name, after, timeout, lambda s, host, _after: compile_host(s, host))


@router.get("/hosts/{name}/config/delta", response_model=HostConfigDelta,
            responses={304: {"description": "no change after `after` within `timeout` seconds"}})
async def watch_config_delta(name: str, request: Request, after: int = Query(-1, ge=-1, le=MAX_BIGINT),
                             timeout: float = Query(0, ge=0, le=300),
                             form: Literal["sections", "objects"] = Query("sections"),
                             p: Principal = Depends(require_infra)) -> Response:
    """The same long-poll, answered with what changed after `after` (HostConfigDelta): the sections of the VPCs
    that changed, not the whole config. `after=-1` answers a whole config in this form. `form=objects`: a
    topology change sends the VTEP entries that changed, not everything (HostConfigDelta says how). The vSwitch
    agent watches this way."""
    own_host(p, name, "hypervisor")
    return await _watch(request, name, after, timeout,
                        lambda s, host, base: compile_host_delta(s, host, base, form))


async def _watch(request: Request, name: str, after: int, timeout: float,
                 build: Callable[[Session, str, int], HostConfig | HostConfigDelta | None]) -> Response:
    """The host's config answered once its revision passes `after`. A host's revision is cheap to read and every
    write that changes its config stamps it (or one of its VPCs, or the topology), so a wake naming them is the
    answer; only a wake without detail (another process, a huge change) is checked in the database."""
    db: Database = db_of(request)
    settings = request.app.state.settings
    request.app.state.beats.note(name)  # a watching host is alive (controller/southbound/liveness.py)
    if after > 0 and await watch_thread(db.revision) < after:
        after = -1  # it holds what this database never had (restored without its epoch): a whole config


    def check() -> tuple[int, set[str]] | None:
        with db.snapshot() as s:
            return host_revision(s, name)

    def compile_now() -> HostConfig | HostConfigDelta | None:
        with db.snapshot() as s:
            return build(s, name, after)

    async def look() -> Held:
        state = await watch_thread(check)
        if state is None:
            raise not_found("host", name)
        return Held(state[0], state[0] > after, state[1])

    async def woken(w: Wake, held: Held) -> Held:
        if w.unknown:  # no detail: ask the database
            return await look()
        return Held(w.revision, w.revision > after, held.value)  # it stamped this host or one of its VPCs

    held, changed = await long_poll(request.app.state.broadcaster, settings.watch_coalesce,
                                    time.monotonic() + min(timeout, settings.max_watch_timeout), look,
                                    lambda w, h: w.concerns(name, h.value), woken, host=name)
    if not changed:
        return Response(status_code=304, headers={"X-Tianji-Revision": str(held.revision)})
    cfg = await watch_thread(compile_now)
    if cfg is None:
        raise not_found("host", name)
    return Response(cfg.model_dump_json(), media_type="application/json",
                    headers={"X-Tianji-Revision": str(cfg.revision)})
