"""A controller served for real (uvicorn on a free port, in a thread) and throwaway PostgreSQL databases: what the
tests and the benches share (the benches import this, not the tests' conftest)."""

from __future__ import annotations

import functools
import os
import socket
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import uvicorn
from sqlalchemy import create_engine, func, select, text

from controller.app import create_app
from controller.serving import server_options
from controller.settings import Settings
from controller.state import models as m
from controller.tls import uvicorn_factory
from tianji.api_client import Client
from tianji.tls import ClientTls

PG_ADMIN_URL = os.environ.get("TIANJI_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgDatabase:
    """A throwaway PostgreSQL database for one test."""

    def __init__(self) -> None:
        self.name = f"tianji_test_{uuid.uuid4().hex[:10]}"
        self.admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        try:
            with self.admin.connect() as c:
                c.execute(text(f'CREATE DATABASE "{self.name}"'))
        except Exception as e:
            pytest.fail(f"PostgreSQL at {PG_ADMIN_URL} is needed for this test and is not usable: {e}. "
                        "Start PostgreSQL with trust auth on 127.0.0.1:5432, or run with TIANJI_TEST_PG=0 "
                        "outside CI to run the SQLite half only.")
        self.url = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + self.name

    def drop(self) -> None:
        with self.admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)'))
        self.admin.dispose()


class Controller:
    """A controller process-equivalent: the real app served by uvicorn on a free port, in a thread."""

    def __init__(self, state_dir: Path, database_url: str | None, host_down_after: float = 15.0,
                 listen: str = "127.0.0.1", port: int | None = None, ca: Path | None = None,
                 **settings: object) -> None:
        """With settings tls_cert/tls_key (and client_ca), HTTPS, its clients verifying against `ca`."""
        self.settings = Settings.from_env(state_dir=state_dir, database_url=database_url,
                                          host_down_after=host_down_after, **settings)
        self.app = create_app(self.settings, announce_token=False)
        self.db = self.app.state.db
        self.admin_token = self.app.state.admin_token
        # the socket is bound here and handed to uvicorn: a port picked then bound later can be taken in between
        self.sock = socket.socket(socket.AF_INET6 if ":" in listen else socket.AF_INET)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((listen, port or 0))
        self.port = self.sock.getsockname()[1]
        self.listen = listen
        s = self.settings
        self.tls = ClientTls(ca=str(ca)) if s.tls_cert else None
        self.url = f"{'https' if s.tls_cert else 'http'}://{'127.0.0.1' if listen == '0.0.0.0' else listen}:{self.port}"
        options = server_options(s.trusted_proxies)
        if s.tls_cert:
            options["ssl_context_factory"] = functools.partial(uvicorn_factory, str(s.tls_cert), str(s.tls_key),
                                                               str(s.client_ca) if s.client_ca else None)
        cfg = uvicorn.Config(self.app, host=listen, port=self.port, log_level="warning", lifespan="on",
                             timeout_graceful_shutdown=1, **options)
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError(f"controller on {self.url} exited while starting (its log above says why)")
            if time.time() > deadline:
                raise RuntimeError(f"controller on {self.url} did not start in 30 s")
            time.sleep(0.02)
        self.admin = self.client(self.admin_token)

    def client(self, token: str | None) -> Client:
        return Client(self.url, token, tls=self.tls)

    def tenant(self, name: str | None = None) -> Client:
        t = self.admin.post("/v1/tenants", {"name": name or f"t-{uuid.uuid4().hex[:8]}"})
        c = self.client(t["token"])
        c.tenant_id = t["id"]  # type: ignore[attr-defined]
        return c

    def orchestrator(self) -> Client:
        """What places VMs: binds tenants' ports to hosts (tenants may not)."""
        if not hasattr(self, "_orchestrator"):
            t = self.admin.post("/v1/orchestrator-tokens", {"name": f"o-{uuid.uuid4().hex[:8]}"})
            self._orchestrator = self.client(t["token"])
        return self._orchestrator

    def host_token(self, host: str, kind: str = "hypervisor") -> str:
        return self.admin.post("/v1/host-tokens", {"host": host, "kind": kind})["token"]

    def raw(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30,
                            verify=self.tls.context() if self.tls else True)

    def snapshot(self) -> dict[str, int]:
        """Row counts of every table and the revision: equal before and after a refused request."""
        with self.db.read() as s:
            counts = {t.name: s.execute(select(func.count()).select_from(t)).scalar()
                      for t in m.Base.metadata.sorted_tables}
            counts["revision"] = s.execute(select(m.Counter.value).where(m.Counter.name == "revision")).scalar()
            return counts

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()
        self.db.engine.dispose()
