"""The host's config as a stream: one connection per watcher for as long as it watches (server-sent events).

`GET /v1/hosts/{name}/config/stream?after=REV` answers `text/event-stream`: an event per change of the host's
config (`event: delta`, `id:` its revision, `data:` a HostConfigDelta from the last one sent), and a comment line
every `keepalive` seconds while nothing changes. Why server-sent events: the changes flow one way (the agent's
few writes, its port reports, stay requests); it is plain HTTP/1.1 through the same TLS, client certificates,
tokens and proxies as every other call, with nothing to add on either side (HTTP/2 would need another server,
a WebSocket another protocol and library for a channel that is one-way anyway). Against the long-poll it
replaces, a busy watcher costs one write per change instead of a request's whole parse, routing, middleware
and authentication, and an idle one nothing but its keep-alive line.

Every stream woken by the same writes is compiled in one batch (controller/southbound/stream_hub.py). The open stream is
also the host's heartbeat, so an agent that streams need not send a request every 2 s to stay up: each liveness
tick notes a beat at the moment the host's TCP stack last acknowledged (controller/southbound/open_streams.py); a stream
without a TCP socket notes one at every event and keep-alive line instead.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse

from controller.api import traces
from controller.api.common import MAX_BIGINT, db_of
from controller.auth import Principal, own_host, require_infra
from controller.errors import not_found
from controller.serving import watch_thread
from controller.southbound import stream_steps as steps
from controller.southbound.liveness import beat_every
from controller.southbound.open_streams import prove
from controller.southbound.stream_steps import StreamState
from controller.southbound.watch import Broadcaster, Subscription, Wake, next_wake
from controller.state.db import Q_REVISION
from controller.state.reads import host_revision

router = APIRouter(tags=["hosts"])
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

    def known() -> tuple[bool, int]:
        with db.snapshot() as s:
            return host_revision(s, name) is not None, s.execute(Q_REVISION).scalar_one()

    found, revision = await watch_thread(known)
    if not found:
        raise not_found("host", name)
    if after > revision:
        after = -1  # it holds what this database never had (restored without its epoch): a whole config
    return StreamingResponse(_events(request, name, after, form, keepalive), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


async def _events(request: Request, name: str, after: int, form: str, keepalive: float) -> AsyncIterator[str]:
    """The stream's turns (controller/southbound/stream_steps.py decides; this waits and writes)."""
    state = request.app.state
    bc, beats, hub = state.broadcaster, state.beats, state.stream_hub
    every = beat_every(state.settings.host_down_after)
    st = StreamState(name, after, form)
    sock = request.scope.get("state", {}).get("tcp_socket")
    proven = prove(sock, state.settings.host_down_after)  # then its beats are the kernel's (open_streams.py)
    sub = bc.subscribe(name)
    key = state.open_streams.add(name, sock, sub) if proven else None
    state.metrics.streams.inc()
    beats.note(name, every)  # a connection just made: heard from now
    beat = None if proven else lambda: beats.note(name, every)  # a stream without a socket: its lines are beats
    try:
        while True:
            if beat is not None:
                beat()
            if st.claim is None:
                bc.hear_all(sub)  # until its VPCs are known again: a write to one it is about to hold must wake it
            compiling = asyncio.ensure_future(hub.compile(steps.question(st)))
            async for line in _keepalives_until(compiling, keepalive, beat):
                yield line
            d = compiling.result()
            if st.claim is None and d is not None:
                bc.keys(sub, steps.held_vpcs(st, d))
            events, done = steps.delta_events(st, d)
            for e in events:
                yield e
            if done:
                return
            if st.asked:  # after the delta, which a trace question must never hold up (api/traces.py)
                for e in steps.trace_events(st, await watch_thread(lambda: traces.pending(state.db, name))):
                    yield e
            vpcs = set(sub.vpcs)
            while (w := await next_wake(sub.queue, time.monotonic() + steps.wait_for(st, keepalive),
                                        lambda w, v=vpcs: w.concerns(name, v))) is None and not st.unconfirmed:
                if beat is not None:
                    beat()
                yield steps.KEEPALIVE
            woken, st.unconfirmed = st.unconfirmed, []
            if w is not None:
                woken += await _with_the_rest(w, sub, bc, state.settings.watch_coalesce, name, vpcs, keepalive)
            for e in steps.after_wakes(st, woken, vpcs, bc.confirmed):
                yield e
    finally:
        _closed(state, sub, key)


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
        yield steps.KEEPALIVE


async def _with_the_rest(w: Wake, sub: Subscription, bc: Broadcaster, coalesce: float, name: str,
                         vpcs: set[str], keepalive: float) -> list[Wake]:
    """The wake that ended the wait, and the writes that came meanwhile: one compile takes them all. While hosts
    join in a mass, a wake of the VTEP list alone waits JOIN_COALESCE_S first (at most half a keep-alive: the
    watcher's patience is a few): a thousand agents booting were a thousand events for each of a thousand streams,
    and the controller's CPU for a minute and more."""
    await bc.settle(coalesce)
    if steps.entries_alone(w, name, vpcs) and bc.joining():
        await asyncio.sleep(min(JOIN_COALESCE_S, keepalive / 2))
    woken = [w]
    while not sub.queue.empty():
        woken.append(sub.queue.get_nowait())
    return woken
