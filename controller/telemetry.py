"""The controller's telemetry: Prometheus metrics (`GET /metrics`, prometheus_client: HELP and TYPE, the
conventions' names and units) and one log line per request (its id, the credential's name, the status and the
latency; JSON or plain text, tianji/logs.py).

Requests are timed to their response's start: a watch's stream then counts as the request that opened it, and
its open streams are a gauge. With several workers each process answers /metrics for itself (its `pid` is in
`tianji_controller_info`): scrape each, or run one worker per scrape target.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import func, select

from controller.state import models as m
from tianji import metrics_http

log = logging.getLogger("tianji.access")
disable_created_metrics()  # no `_created` series: twice the series for a time Prometheus does not use
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
WATCH_BUCKETS = (0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# hosts' watches: held until something changes (or a stream, open for as long as the host is), not API latency
WATCH_ROUTES = frozenset({"/v1/hosts/{name}/config", "/v1/hosts/{name}/config/delta", "/v1/hosts/{name}/config/stream",
                          "/v1/gateways/{name}/config", "/v1/gateways/{name}/config/delta"})
REQUEST_ID = "x-request-id"


class Metrics:
    """One app's metrics, in its own registry (tests serve several apps in one process)."""

    def __init__(self, state: Any) -> None:
        self.registry = r = metrics_http.registry()
        self.requests = Counter("tianji_controller_requests", "API requests answered, by route and status",
                                ["method", "route", "status"], registry=r)
        self.latency = Histogram("tianji_controller_request_duration_seconds",
                                 "Time to an API request's response start (hosts' watches are not in it)",
                                 ["method", "route"], buckets=LATENCY_BUCKETS, registry=r)
        self.watches = Histogram("tianji_controller_watch_duration_seconds",
                                 "Time a host's watch was held until answered (a long-poll's change or timeout; a "
                                 "stream's opening)", ["route"], buckets=WATCH_BUCKETS, registry=r)
        self.compile = Histogram("tianji_controller_compile_duration_seconds",
                                 "Time to compile hosts' configs (one batch of a watch or a host's whole config)",
                                 ["kind"], buckets=LATENCY_BUCKETS, registry=r)
        self.streams = Gauge("tianji_controller_config_streams", "Open config streams (SSE) of watching hosts",
                             registry=r)
        self.info = Gauge("tianji_controller_info", "This controller process", ["pid", "database"], registry=r)
        self.info.labels(str(os.getpid()), state.db.engine.dialect.name).set(1)
        r.register(_Live(state))

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _Live:
    """What is read when scraped: the revision, waiting watches, the database pool, hosts by kind and status."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def collect(self) -> Any:
        st = self.state
        yield _gauge("tianji_controller_revision", "The newest revision this process has seen",
                     float(st.broadcaster.latest))
        yield _gauge("tianji_controller_watch_waiters", "Watches (long-polls and streams) waiting for a change",
                     float(len(st.broadcaster.subs)))
        pool = st.db.engine.pool
        checked = getattr(pool, "checkedout", None)
        if checked is not None:
            yield _gauge("tianji_controller_db_connections_in_use", "Database connections checked out of the pool",
                         float(checked()))
        hosts = GaugeMetricFamily("tianji_controller_hosts", "Registered hosts by kind and status",
                                  labels=["kind", "status"])
        with st.db.read(single=True) as s:
            rows = s.execute(select(m.Host.kind, m.Host.status, func.count()).group_by(m.Host.kind, m.Host.status))
            for kind, status, n in sorted(rows.all()):
                hosts.add_metric([kind, status], n)
        yield hosts


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


class Telemetry:
    """ASGI middleware, outermost: every request counted, timed and logged, with an id (the client's
    X-Request-Id, else a new one) echoed in the response."""

    def __init__(self, app: Callable[..., Awaitable[None]], state: Any) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        rid = next((v.decode("latin-1")[:64] for k, v in scope["headers"] if k == b"x-request-id"), None) \
            or uuid.uuid4().hex[:16]
        scope.setdefault("state", {})["request_id"] = rid
        metrics: Metrics = self.state.metrics
        started: list[int] = []

        async def timed_send(message: dict) -> None:
            if message["type"] == "http.response.start" and not started:
                started.append(message["status"])
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode("latin-1"))]
                self._done(scope, rid, message["status"], time.perf_counter() - t0, metrics)
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        except Exception:
            if not started:
                self._done(scope, rid, 500, time.perf_counter() - t0, metrics)
            raise

    @staticmethod
    def _done(scope: dict, rid: str, status: int, took: float, metrics: Metrics) -> None:
        route = getattr(scope.get("route"), "path", None) or "unmatched"
        if scope["path"].startswith("/v1/") and route.startswith("/") and not route.startswith("/v1/"):
            route = "/v1" + route  # an included router's routes carry their own path, without its prefix
        method = scope["method"]
        metrics.requests.labels(method, route, str(status)).inc()
        if _is_watch(scope, route):
            metrics.watches.labels(route).observe(took)
        else:
            metrics.latency.labels(method, route).observe(took)
        p = scope.get("state", {}).get("principal")
        who = (p.name or p.kind) if p is not None else "-"
        level = logging.DEBUG if p is not None and p.kind == "host" and status < 400 else logging.INFO
        if log.isEnabledFor(level):
            log.log(level, "%s %s %d %.1fms", method, scope["path"], status, took * 1000,
                    extra={"request_id": rid, "credential": who, "method": method, "path": scope["path"],
                           "route": route, "status": status, "latency_ms": round(took * 1000, 2)})


def _is_watch(scope: dict, route: str) -> bool:
    """A stream, or a long-poll (a config route asked with a timeout): one `timeout=0` read is an API call."""
    if route not in WATCH_ROUTES:
        return False
    if route.endswith("/stream"):
        return True
    timeout = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("timeout", ["0"])[0]
    try:
        return float(timeout) > 0
    except ValueError:
        return False
