"""A controller being stopped (SIGTERM) marks nobody down: it takes no more beats from the moment it is told to
stop, while its liveness loop runs until its open connections close; judged then, every gateway was silent and
was failed over at each restart."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from tests.support.controller import free_port
from tests.support.wait import wait_for

TIANJI = str(Path(sys.executable).parent / "tianji")


def test_a_stopping_controller_fails_no_gateway_over(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = os.environ | {"TIANJI_GATEWAY_DOWN_AFTER": "0.5", "TIANJI_RATE_LIMIT": "0"}
    proc = subprocess.Popen([TIANJI, "controller", "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--state-dir", str(tmp_path), "--insecure-http", "--log-level", "warning"],
                            env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "log", "w"))
    stop = threading.Event()
    try:
        wait_for(lambda: (tmp_path / "admin.token").exists(), 30, "the controller's admin token")
        token = (tmp_path / "admin.token").read_text().strip()
        admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"})

        def answering() -> bool:
            try:
                return admin.get("/healthz").status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(answering, 30, "the controller answering")
        admin.post("/v1/hosts", json={"name": "gw1", "vtep_ip": "172.31.1.1", "kind": "gateway", "role": "nat"})
        admin.post("/v1/hosts", json={"name": "hv1", "vtep_ip": "172.31.0.1"})

        def beat() -> None:  # as an instance does, on its own connection
            with httpx.Client(base_url=url, headers=admin.headers) as c:
                while not stop.is_set():
                    try:
                        c.post("/v1/hosts/gw1/status", json={"ports": {}})
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.1)

        threading.Thread(target=beat, daemon=True).start()
        time.sleep(1.0)
        assert admin.get("/v1/hosts/gw1").json()["status"] == "up"
        # an open stream keeps the stopping controller (and its liveness loop) running for its graceful 2 s
        with httpx.Client(base_url=url, headers=admin.headers, timeout=10) as s, \
                s.stream("GET", "/v1/hosts/hv1/config/stream", params={"keepalive": 0.5}) as r:
            assert r.status_code == 200
            proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            try:
                for _ in r.iter_lines():  # until the stopping controller cuts it (after its graceful 2 s)
                    pass
            except httpx.RemoteProtocolError:
                pass
        # uvicorn ends by raising the signal it caught again (-15); it ran past the gateway's silence
        assert proc.wait(30) in (0, -signal.SIGTERM) and time.monotonic() - t0 > 1.0
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
    with sqlite3.connect(tmp_path / "tianji.db") as db:
        assert db.execute("SELECT status FROM hosts WHERE name = 'gw1'").fetchone() == ("up",), \
            (tmp_path / "log").read_text()[-3000:]
