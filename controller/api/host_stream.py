"""The host's config as a stream: one connection per watcher for as long as it watches (server-sent events).

`GET /v1/hosts/{name}/config/stream?after=REV` answers `text/event-stream`: an event per change of the host's
config (`event: delta`, `id:` its revision, `data:` a HostConfigDelta from the last one sent), and a comment line
every `keepalive` seconds while nothing changes. Why server-sent events: the changes flow one way (the agent's
few writes, its port reports, stay requests); it is plain HTTP/1.1 through the same TLS, client certificates,
tokens and proxies as every other call, with nothing to add on either side (HTTP/2 would need another server,
a WebSocket another protocol and library for a channel that is one-way anyway). Against the long-poll it
replaces, a busy watcher costs one write per change instead of a request's whole parse, routing, middleware
and authentication, and an idle one nothing but its keep-alive line.

Every stream woken by the same writes is compiled in one batch (controller/stream_hub.py). The open stream is
also the host's heartbeat, so an agent that streams need not send a request every 2 s to stay up: each liveness
tick notes a beat at the moment the host's TCP stack last acknowledged (controller/open_streams.py); a stream
without a TCP socket notes one at every event and keep-alive line instead.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse

from controller.api import traces
from controller.api.common import MAX_BIGINT, db_of
from controller.auth import Principal, own_host, require_infra
from controller.errors import not_found
from controller.host_deltas import Asked
from controller.liveness import beat_every
from controller.open_streams import prove
from controller.patches import Sent
from controller.reads import host_revision
from controller.serving import watch_thread
from controller.watch import Broadcaster, Subscription, Wake, next_wake

router = APIRouter(tags=["hosts"])
RECHECK_S = 0.1  # how soon a VTEP list change not yet confirmed by the commit order is looked at again
JOIN_COALESCE_S = 1.0  # while hosts join in a mass, how often a stream takes the new VTEP entries

@router.get("/hosts/{name}/config/stream",
            response_class=StreamingResponse,
            responses={200: {"content": {"text/event-stream": {"schema": {
                "type": "string", "description": "server-sent events: `event: delta` (data: a HostConfigDelta as "
                                                 "JSON, from the last one), `event: gone`, `event: report` (the "
                                                 "controller holds this host down: send your report), and `:` "
                                                 "keep-alives"}}},
                             "description": "an event per change (`data`: a HostConfigDelta from the last one)"}})
async def stream_config(name: str, request: Request, after: int = Query(-1, ge=-1, le=MAX_BIGINT),
                        form: Literal["sections", "objects"] = Query("objects"),
                        keepalive: float = Query(5.0, ge=0.2, le=60),
                        p: Principal = Depends(require_infra)) -> StreamingResponse:
    """The delta watch on one connection: the first event takes the config from `after` (-1: a whole config),
    each next one from the event before. `keepalive`: seconds between keep-alive lines (the client's read timeout
    is a few of them: a stalled controller is noticed that soon)."""
    own_host(p, name, "hypervisor")
    db = db_of(request)

    def known() -> bool:
        with db.snapshot() as s:
            return host_revision(s, name) is not None

    if not await watch_thread(known):
        raise not_found("host", name)
    return StreamingResponse(_events(request, name, after, form, keepalive), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


async def _events(request: Request, name: str, after: int, form: str, keepalive: float) -> AsyncIterator[str]:
    state = request.app.state
    bc, beats, hub = state.broadcaster, state.beats, state.stream_hub
    every = beat_every(state.settings.host_down_after)
    sent = Sent() if form == "objects" else None  # what this stream sent (controller/patches.py)
    sock = request.scope.get("state", {}).get("tcp_socket")
    proven = prove(sock, state.settings.host_down_after)  # then its beats are the kernel's (open_streams.py)
    sub = bc.subscribe(name)
    key = state.open_streams.add(name, sock, sub) if proven else None
    state.metrics.streams.inc()
    beats.note(name, every)  # a connection just made: heard from now
    claim: int | None = None
    unconfirmed: list[Wake] = []  # VTEP list wakes newer than what the commit order confirmed: looked at again
    asked = True  # questions put before this stream subscribed (a reconnect, or a question racing the connect)
    told: set[str] = set()  # each question once per stream (a wake may come after the first look already sent it)
    try:
        while True:
            if not proven:
                beats.note(name, every)
            if claim is None:
                bc.hear_all(sub)  # until its VPCs are known again: a write to one it is about to hold must wake it
            compiling = asyncio.ensure_future(hub.compile(Asked(name, after, form, sent, claim)))
            beat = None if proven else lambda: beats.note(name, every)
            async for line in _keepalives_until(compiling, keepalive, beat):
                yield line
            d = compiling.result()
            if d is None:
                yield "event: gone\ndata: {}\n\n"  # the host was deleted
                return
            if claim is None:
                bc.keys(sub, frozenset((sent.vpc_ids if sent else d.vpc_ids) or ()))
            if d.revision > after or after < 0 or d.vtep_updates or d.vteps_removed:
                yield f"event: delta\nid: {d.revision}\ndata: {d.model_dump_json()}\n\n"
                after = d.revision
            if asked:  # after the delta, which a trace question must never hold up (api/traces.py)
                for q in await _questions(state.db, name, told):
                    yield f"event: trace\ndata: {json.dumps(q)}\n\n"
            vpcs = set(sub.vpcs)
            while (w := await next_wake(sub.queue, time.monotonic() + (RECHECK_S if unconfirmed else keepalive),
                                        lambda w, v=vpcs: w.concerns(name, v))) is None and not unconfirmed:
                if not proven:
                    beats.note(name, every)
                yield ": keepalive\n\n"
            woken, unconfirmed = unconfirmed, []
            if w is not None:
                woken += await _with_the_rest(w, sub, bc, state.settings.watch_coalesce, name, vpcs,
                                                keepalive)
            if any(x.report for x in woken):  # held down while streaming: only the host's report brings it back
                woken = [x for x in woken if not x.report]
                yield "event: report\ndata: {}\n\n"
            asked = any(name in x.traces or x.unknown for x in woken)  # a live trace question for this switch
            # (the objects form only: the sections form answers a whole config to a VTEP list change)
            claim = _vteps_only(name, vpcs, woken, after, bc.confirmed) if sent else None
            if claim is not None:
                unconfirmed = [x for x in woken if x.revision > claim and x.concerns(name, vpcs)]
    finally:
        _closed(state, sub, key)


async def _questions(db: Any, name: str, told: set[str]) -> list[dict]:
    """The live trace questions for `name` this stream has not sent yet (api/traces.py)."""
    new = [q for q in await watch_thread(lambda: traces.pending(db, name)) if q["id"] not in told]
    told.update(q["id"] for q in new)
    return new


def _closed(state: Any, sub: Subscription, key: Any) -> None:
    state.broadcaster.unsubscribe(sub)
    state.metrics.streams.dec()
    if key is not None:
        state.open_streams.remove(key)


async def _keepalives_until(task: asyncio.Future, keepalive: float,
                            beat: Callable[[], None] | None) -> AsyncIterator[str]:
    """Keep-alive lines while `task` (the stream's compile) runs: an overloaded controller is slow, not gone. A
    watcher that heard nothing for a few keep-alives reconnects, and its next compile queues behind the same backlog:
    at 200,000 ports here every stream timed out while batches queued, and none was answered any more."""
    while not (await asyncio.wait({task}, timeout=keepalive))[0]:
        if beat is not None:  # a stream without a TCP socket to prove it: its lines are its beats
            beat()
        yield ": keepalive\n\n"


async def _with_the_rest(w: Wake, sub: Subscription, bc: Broadcaster, coalesce: float, name: str,
                         vpcs: set[str], keepalive: float) -> list[Wake]:
    """The wake that ended the wait, and the writes that came meanwhile: one compile takes them all. While hosts
    join in a mass, a wake of the VTEP list alone waits JOIN_COALESCE_S first (at most half a keep-alive: the
    watcher's patience is a few): a thousand agents booting were a thousand events for each of a thousand streams,
    and the controller's CPU for a minute and more."""
    await bc.settle(coalesce)
    if _entries_alone(w, name, vpcs) and bc.joining():
        await asyncio.sleep(min(JOIN_COALESCE_S, keepalive / 2))
    woken = [w]
    while not sub.queue.empty():
        woken.append(sub.queue.get_nowait())
    return woken


def _entries_alone(w: Wake, name: str, vpcs: set[str]) -> bool:
    """`w` changes nothing of `name`'s config but VTEP entries (a host joined, left or moved)."""
    return w.vteps and not w.unknown and name not in w.hosts and vpcs.isdisjoint(w.vpcs)


def _vteps_only(name: str, vpcs: set[str], woken: list[Wake], after: int, confirmed: int) -> int | None:
    """A host joining wakes every stream: for one it changes nothing else for (every wake since its last event
    concerns it by the VTEP list alone), the revision its delta of VTEP entries may claim: the newest of those
    wakes the database's order confirms (an older write of another process to one of its VPCs may still be on
    its way); None: compile it whole."""
    concerning = [x for x in woken if x.concerns(name, vpcs)]
    if not all(_entries_alone(x, name, vpcs) for x in concerning):
        return None
    return max([after, *(x.revision for x in concerning if x.revision <= confirmed)])
