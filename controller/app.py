"""The FastAPI application: routers under /v1, problem+json errors, background liveness checks."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path

from fastapi import FastAPI, Request, Response
from fastapi.responses import PlainTextResponse
from fastapi.staticfiles import StaticFiles

from controller import errors, openapi
from controller.api import (
    eip_pools,
    eips,
    gateways,
    host_stream,
    hosts,
    peerings,
    ports,
    reachability,
    security_groups,
    subnets,
    tenants,
    traces,
    vpcs,
)
from controller.api.ops_schemas import Healthz, Readyz
from controller.auth import cached_principal, forget_credentials
from controller.guards import Guard
from controller.idempotency import Idempotency
from controller.replicas import Leadership, admin_credential, shared_settings
from controller.roles.lb import health as lb_health
from controller.roles.lb import routes as lb
from controller.roles.line import routes as private_lines
from controller.roles.nat import routes as nat
from controller.roles.service import routes as services
from controller.serving import Collector, limit_threads
from controller.settings import Settings
from controller.southbound import liveness_loop
from controller.southbound.liveness import Beats
from controller.southbound.open_streams import OpenStreams
from controller.southbound.stream_hub import StreamHub
from controller.southbound.watch import Broadcaster
from controller.state.db import Database
from controller.telemetry import Metrics, Telemetry
from controller.tls import reload_certificates
from tianji import logs

log = logging.getLogger("tianji.controller")


def create_app(settings: Settings | None = None, *, announce_token: bool = True) -> FastAPI:
    settings = settings or Settings.from_env()
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    private_database_files(settings)
    db = Database(settings.url, settings.sqlite_synchronous)
    db.migrate()
    private_database_files(settings)
    admin_token, admin_hash, created = admin_credential(db, settings.state_dir, settings.admin_token_file)
    if announce_token:
        _announce_admin_token(settings, created, admin_token is not None)
    head = db.migration_head()
    settings_differ = shared_settings(db, settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loop = asyncio.get_running_loop()
        app.state.broadcaster.start(loop)
        app.state.collector.start()
        app.state.leadership.start()
        limit_threads()
        _take_signals(app, loop, reload_certificates)
        task = asyncio.create_task(liveness_loop.run(app.state))
        try:
            yield
        finally:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
            app.state.broadcaster.stop()
            app.state.leadership.stop()

    app = FastAPI(title="Tianji controller", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Tenant VPC networking for private GPU clouds: VPCs, subnets, ports, peering, "
                              "route tables, security groups; and the host watch API agents reconcile from.")
    app.state.settings, app.state.db, app.state.admin_token = settings, db, admin_token
    app.state.admin_hash, app.state.settings_differ = admin_hash, settings_differ
    app.state.leadership = Leadership(db, settings.state_dir)
    app.state.broadcaster = Broadcaster(db, revoked=lambda: forget_credentials(app.state),
                                        hearing=lambda on: setattr(app.state, "hears_revocations", on))
    app.state.beats = Beats()
    app.state.open_streams = OpenStreams()
    app.state.reports = {}  # host -> its agent's last report (controller/api/hosts.py AgentReport)
    app.state.stream_hub = StreamHub(db)
    app.state.collector = Collector()
    app.state.metrics = Metrics(app.state)
    app.state.stream_hub.timed = app.state.metrics.compile.labels("stream-batch").observe
    errors.install(app)
    app.add_middleware(Idempotency, state=app.state)  # inside the guard: it knows the credential
    app.add_middleware(Guard, state=app.state)
    app.add_middleware(Telemetry, state=app.state)  # added last: outermost, so it sees every answer
    # the agents' and gateways' routes first: routes are matched in turn (about 3 µs each in FastAPI 0.165), and a
    # thousand hosts' reports and streams are most of the requests
    for r in (hosts, host_stream, gateways, tenants, vpcs, subnets, ports, peerings, security_groups, eips, nat,
              eip_pools, lb, lb_health, private_lines, services, reachability, traces):
        app.include_router(r.router, prefix="/v1", responses=errors.ERROR_RESPONSES)

    _ops_routes(app, db, head)
    openapi.install(app)
    app.mount("/ui", StaticFiles(directory=Path(__file__).parent / "ui", html=True), name="console")
    return app


def _announce_admin_token(settings: Settings, created: bool, held: bool) -> None:
    """Where the admin token is, never the token itself: stdout ends up in journald."""
    if created:
        print(f"tianji: created the admin token in {settings.state_dir / 'admin.token'} (mode 0600)", flush=True)
    elif not held:
        print("tianji: the cluster's admin token was made by another replica (its state directory, or "
              "TIANJI_ADMIN_TOKEN_FILE); this one accepts it", flush=True)


def _ops_routes(app: FastAPI, db: Database, head: str) -> None:
    """/healthz and /readyz: for the load balancer in front of the replicas, without a token."""

    @app.get("/healthz", tags=["ops"], response_model=Healthz, response_model_exclude_none=True)
    def healthz(request: Request) -> dict:
        """Unauthenticated: the process is alive (a load balancer's liveness probe). With the admin token, also
        the revision, the database kind and this replica's role."""
        if (p := cached_principal(app.state, request.headers.get("authorization", ""))) is not None and p.is_admin:
            lead = app.state.leadership
            return {"status": "ok", "revision": db.revision(), "database": db.engine.dialect.name,
                    "role": lead.role, "liveness_checks": lead.leading(), "pid": os.getpid(),
                    "settings_differ_from_other_replicas": app.state.settings_differ}
        return {"status": "ok"}

    @app.get("/metrics", tags=["ops"], response_class=PlainTextResponse,
             responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text exposition"}})
    def metrics(request: Request) -> Response:
        """Prometheus metrics of this controller process: requests by route and status and their latency, open
        config streams and waiting watches, compile time, the revision, the database pool, hosts by status. The
        admin token (a bearer credential in the scrape config), unless the controller runs with
        TIANJI_METRICS_OPEN=true."""
        if not app.state.settings.metrics_open:
            p = cached_principal(app.state, request.headers.get("authorization", ""))
            if p is None or not p.is_admin:
                raise errors.ApiError(401, "metrics need the admin token (or TIANJI_METRICS_OPEN=true)")
        body, kind = app.state.metrics.exposition()
        return Response(body, media_type=kind)

    @app.get("/readyz", tags=["ops"], response_model=Readyz, response_model_by_alias=True,
             responses={503: {"description": "not ready: the reason is in `detail`"}})
    def readyz() -> dict:
        """Unauthenticated: whether this replica should get traffic: its database answers, the schema is at
        this controller's head, and it leads or follows the leader election (nothing about tenants)."""
        try:
            at = db.migration_current()
        except Exception as e:
            raise errors.ApiError(503, f"the database does not answer: {type(e).__name__}") from None
        if at != head:
            raise errors.ApiError(503, f"the database schema is at {at}, this controller needs {head}: migrate "
                                       "(start one controller of this version, it migrates)")
        if not app.state.leadership.live():
            raise errors.ApiError(503, "the leader election has no answer from the database")
        return {"status": "ready", "schema": at, "role": app.state.leadership.role}


def private_database_files(settings: Settings) -> None:
    """The SQLite database holds every tenant's network, the credentials' hashes and private lines' keys: readable
    by its owner only, wherever it is. Made 0600 before SQLite opens it (its -wal and -shm files take the main
    file's mode), and set again for files an older version made."""
    if (db := settings.sqlite_path) is None:
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    if not db.exists():  # never opened once SQLite has it: closing any descriptor of the file drops the process's
        # POSIX locks on it, and another process (a backup) closing last then deleted the WAL under the controller
        os.close(os.open(db, os.O_CREAT | os.O_WRONLY, 0o600))
    for f in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        if f.exists():
            f.chmod(0o600)


def app_from_env() -> FastAPI:
    """Factory for `uvicorn --workers`: every worker process builds its app (and its logging) from the
    environment."""
    logs.setup(os.environ.get("TIANJI_LOG_LEVEL", "info"))
    return create_app(Settings.from_env(), announce_token=False)


def _take_signals(app: FastAPI, loop: asyncio.AbstractEventLoop, reload_certificates: Callable[[], None]) -> None:
    """SIGHUP reloads the certificates. From SIGTERM or SIGINT on, this process takes no more requests (beats
    neither) but its liveness loop runs until its connections close (up to the graceful 2 s): a stopping leader
    judged every gateway silent and failed them over at each restart. It marks nobody down from then on;
    uvicorn's own handler still runs."""
    with suppress(ValueError, RuntimeError, NotImplementedError):  # only the main thread takes signals
        loop.add_signal_handler(signal.SIGHUP, reload_certificates)
    app.state.stopping = False
    for sig in (signal.SIGTERM, signal.SIGINT):
        prev = signal.getsignal(sig)

        def on_signal(signum: int, frame: object, prev: object = prev) -> None:
            app.state.stopping = True
            if callable(prev):
                prev(signum, frame)

        with suppress(ValueError):  # not the main thread (the tests' in-process controllers): never stopped so
            signal.signal(sig, on_signal)
