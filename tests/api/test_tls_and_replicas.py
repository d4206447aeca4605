"""Production readiness: HTTPS with client certificates for hosts, certificate rotation without dropping watches,
replicas sharing the admin credential through the database, one leader elected by an advisory lock, /healthz and
/readyz for the load balancer, SQLite refusing a second controller, plain HTTP only when asked for."""

from __future__ import annotations

import ssl
import threading
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from controller.replicas import Leadership, hold_sqlite
from controller.settings import Settings
from controller.tls import reload_certificates
from tests.conftest import pg_wanted, served
from tests.support.controller import Controller, PgDatabase
from tianji.api_client import ApiFailure, Client
from tianji.pki import Authority
from tianji.tls import ClientTls


@pytest.fixture
def pki(tmp_path: Path) -> Authority:
    ca = Authority(tmp_path / "pki")
    ca.issue("controller", server_names=["127.0.0.1"])
    for h in ("hv1", "hv2"):
        ca.issue(h)
    return ca


def tls_controller(tmp_path: Path, pki: Authority, database_url: str | None = None, **kw: object) -> Controller:
    d = pki.dir
    return Controller(tmp_path / "state", database_url, ca=pki.cert_path, tls_cert=d / "controller.pem",
                      tls_key=d / "controller.key", client_ca=pki.cert_path, **kw)


def host_client(c: Controller, pki: Authority, token: str, cert: str | None) -> httpx.Client:
    tls = ClientTls(ca=str(pki.cert_path), cert=str(pki.dir / f"{cert}.pem") if cert else None,
                    key=str(pki.dir / f"{cert}.key") if cert else None)
    return httpx.Client(base_url=c.url, headers={"Authorization": f"Bearer {token}"}, verify=tls.context(),
                        timeout=10)


def test_hosts_need_their_own_certificate_tenants_need_none(tmp_path: Path, pki: Authority) -> None:
    c = tls_controller(tmp_path, pki)
    try:
        assert c.url.startswith("https://")
        tok = {h: c.host_token(h) for h in ("hv1", "hv2")}
        reg = {"name": "hv1", "vtep_ip": "172.31.0.1"}
        r = host_client(c, pki, tok["hv1"], None).post("/v1/hosts", json=reg)
        assert r.status_code == 403 and r.json()["field"] == "certificate" and "--cert" in r.json()["detail"]
        r = host_client(c, pki, tok["hv1"], "hv2").post("/v1/hosts", json=reg)  # a certificate naming another host
        assert r.status_code == 403
        assert host_client(c, pki, tok["hv1"], "hv1").post("/v1/hosts", json=reg).status_code in (200, 201)
        host_client(c, pki, tok["hv2"], "hv2").post("/v1/hosts", json={"name": "hv2", "vtep_ip": "172.31.0.2"})
        # hv1's certificate does not read hv2's config, with hv1's token nor with hv2's (a stolen token)
        for token in (tok["hv1"], tok["hv2"]):
            assert host_client(c, pki, token, "hv1").get("/v1/hosts/hv2/config").status_code == 403
        assert host_client(c, pki, tok["hv2"], "hv2").get("/v1/hosts/hv2/config").status_code == 200
        assert c.tenant().get("/v1/vpcs") == []  # tenants: TLS, no certificate
        # a certificate from another CA fails the handshake; so does a client that does not trust ours
        other = Authority(tmp_path / "other")
        other.issue("hv1")
        bad = ClientTls(ca=str(pki.cert_path), cert=str(other.dir / "hv1.pem"), key=str(other.dir / "hv1.key"))
        with pytest.raises(httpx.TransportError):  # TLS 1.3: the server's alert comes after the client's Finished
            httpx.get(f"{c.url}/healthz", verify=bad.context())
        with pytest.raises(ApiFailure) as e:
            Client(c.url, c.admin_token, tls=ClientTls(ca=str(other.cert_path))).get("/v1/tenants")
        assert e.value.status == 0 and "TIANJI_CA" in e.value.detail
        with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port
            httpx.get(c.url.replace("https", "http") + "/healthz", timeout=3).raise_for_status()
    finally:
        c.stop()


def serial_served(url: str, ca: Path) -> int:
    host, port = url.removeprefix("https://").split(":")
    ctx = ssl.create_default_context(cafile=str(ca))
    import socket

    with socket.create_connection((host, int(port))) as s, ctx.wrap_socket(s, server_hostname=host) as t:
        from cryptography import x509

        return x509.load_der_x509_certificate(t.getpeercert(binary_form=True)).serial_number


def test_certificate_rotation_keeps_the_open_watches(tmp_path: Path, pki: Authority) -> None:
    """A new certificate in the same files and a reload (what SIGHUP does): new connections get it, a long-poll
    already open on the old one is answered on it."""
    c = tls_controller(tmp_path, pki)
    try:
        c.admin.post("/v1/hosts", {"name": "hv1", "vtep_ip": "172.31.0.1"})
        rev = c.admin.get("/v1/hosts/hv1/config")["revision"]
        before = serial_served(c.url, pki.cert_path)
        got: dict = {}
        watch = threading.Thread(target=lambda: got.update(
            cfg=c.admin.get("/v1/hosts/hv1/config", after=rev, timeout=20)))
        watch.start()
        time.sleep(0.5)
        pki.issue("controller", server_names=["127.0.0.1"])  # the rotation: same paths, new certificate
        assert reload_certificates() >= 1
        after = serial_served(c.url, pki.cert_path)
        assert after != before
        t = c.tenant()
        v = t.post("/v1/vpcs", {"name": "p", "cidr": "10.0.0.0/16"})
        sn = t.post("/v1/subnets", {"vpc_id": v["id"], "name": "s", "cidr": "10.0.1.0/24"})
        c.orchestrator().post("/v1/ports", {"subnet_id": sn["id"], "name": "a", "host": "hv1"})
        watch.join(10)
        assert got["cfg"]["revision"] > rev and len(got["cfg"]["ports"]) == 1
    finally:
        c.stop()


def test_health_and_readiness_say_nothing_about_tenants(tmp_path: Path) -> None:
    with served("sqlite", tmp_path) as c:
        c.tenant("acme")
        assert httpx.get(f"{c.url}/healthz").json() == {"status": "ok"}
        r = httpx.get(f"{c.url}/readyz")
        assert r.status_code == 200 and r.json() == {"status": "ready", "schema": c.db.migration_head(),
                                                     "role": "leader"}
        assert c.admin.get("/healthz")["role"] == "leader"  # the admin learns more
        with c.db.engine.begin() as conn:  # a schema behind this controller's: not ready, and why
            conn.execute(text("UPDATE alembic_version SET version_num = '0011'"))
        r = httpx.get(f"{c.url}/readyz")
        assert r.status_code == 503 and "0011" in r.json()["detail"] and "migrate" in r.json()["detail"]
        assert httpx.get(f"{c.url}/healthz").status_code == 200  # alive all the same


def test_sqlite_takes_one_controller(tmp_path: Path) -> None:
    s = Settings.from_env(state_dir=tmp_path)
    held = hold_sqlite(s)
    try:
        with pytest.raises(SystemExit) as e:
            hold_sqlite(s)
        assert "another controller" in str(e.value) and "PostgreSQL" in str(e.value)
    finally:
        assert held is not None
        held.close()
    hold_sqlite(s).close()  # free again once the first is gone


def test_plain_http_only_when_asked_for(tmp_path: Path) -> None:
    from tianjictl.main import app

    r = CliRunner().invoke(app, ["controller", "serve", "--state-dir", str(tmp_path)])
    assert r.exit_code != 0 and "--insecure-http" in r.output and "--tls-cert" in r.output


def test_replicas_share_the_admin_credential_through_the_database(tmp_path: Path) -> None:
    if not pg_wanted():
        pytest.skip("PostgreSQL half disabled (TIANJI_TEST_PG=0)")
    pg = PgDatabase()
    try:
        a = Controller(tmp_path / "a", pg.url)
        # a state directory of its own (no admin.token there), and a setting that should be the cluster's
        b = Controller(tmp_path / "b", pg.url, gateway_down_after=1.0)
        try:
            assert b.admin_token is None and not (tmp_path / "b" / "admin.token").exists()
            assert Client(b.url, a.admin_token).get("/v1/tenants") == []
            health = Client(b.url, a.admin_token).get("/healthz")
            assert health["settings_differ_from_other_replicas"] == ["gateway_down_after"]
            assert a.admin.get("/healthz")["settings_differ_from_other_replicas"] == []
            with pytest.raises(ApiFailure):
                Client(b.url, "tja_not-the-token").get("/v1/tenants")
        finally:
            b.stop()
            a.stop()
        shared = tmp_path / "operator.token"  # the operator names a file: that token, on every replica
        shared.write_text("tja_operator-chosen-token\n")
        c = Controller(tmp_path / "c", pg.url, admin_token_file=shared)
        try:
            assert Client(c.url, "tja_operator-chosen-token").get("/v1/tenants") == []
            with pytest.raises(ApiFailure):
                Client(c.url, a.admin_token).get("/v1/tenants")
        finally:
            c.stop()
    finally:
        pg.drop()


def test_one_leader_and_a_handover_when_it_dies(tmp_path: Path) -> None:
    """Three candidates on one PostgreSQL database: one leads; when its session ends, another leads within a few
    election ticks, never two at once."""
    if not pg_wanted():
        pytest.skip("PostgreSQL half disabled (TIANJI_TEST_PG=0)")
    from controller.state.db import Database

    pg = PgDatabase()
    dbs = [Database(pg.url) for _ in range(3)]
    dbs[0].migrate()
    cands = [Leadership(db, tmp_path) for db in dbs]
    try:
        for c in cands:
            c.start()
        deadline = time.monotonic() + 5
        while sum(c.is_leader for c in cands) != 1:
            assert time.monotonic() < deadline, "nobody leads"
            time.sleep(0.05)
        first = next(c for c in cands if c.is_leader)
        first.stop()  # its loop ends, its session closes, the lock goes with it
        t0 = time.monotonic()
        while not any(c.is_leader for c in cands if c is not first):
            assert time.monotonic() - t0 < 3, "no handover"
            assert sum(c.is_leader for c in cands if c is not first) <= 1
            time.sleep(0.02)
        assert sum(c.is_leader for c in cands if c is not first) == 1
        new = next(c for c in cands if c is not first and c.is_leader)
        assert not new.leading() and new.leading(grace=0)  # it judges silence only after its takeover grace
    finally:
        for c in cands:
            c.stop()
        time.sleep(0.6)
        for db in dbs:
            db.engine.dispose()
        pg.drop()


def test_a_revocation_is_heard_at_once_by_every_replica(tmp_path: Path) -> None:
    """A tenant token and a host token, each used (and so cached) on replica B, revoked through replica A: B
    refuses them at once, not after a cache's lifetime."""
    if not pg_wanted():
        pytest.skip("PostgreSQL half disabled (TIANJI_TEST_PG=0)")
    pg = PgDatabase()
    try:
        a = Controller(tmp_path / "a", pg.url)
        b = Controller(tmp_path / "b", pg.url)
        try:
            deadline = time.monotonic() + 5
            while not getattr(b.app.state, "hears_revocations", False):  # its LISTEN connection is up
                assert time.monotonic() < deadline
                time.sleep(0.05)
            t = a.tenant()
            tok = a.admin.post(f"/v1/tenants/{t.tenant_id}/tokens", {"name": "extra"})
            hv = a.admin.post("/v1/host-tokens", {"host": "hv1"})
            on_b = {"tenant": Client(b.url, tok["token"]), "host": Client(b.url, hv["token"])}
            assert on_b["tenant"].get("/v1/vpcs") == [] and on_b["host"].get("/v1/hosts") == []
            a.admin.delete(f"/v1/tenants/{t.tenant_id}/tokens/{tok['id']}")
            a.admin.delete(f"/v1/host-tokens/{hv['id']}")
            t0 = time.monotonic()
            for who, c in on_b.items():
                while True:
                    try:
                        c.get("/v1/hosts" if who == "host" else "/v1/vpcs")
                    except ApiFailure as e:
                        assert e.status == 401
                        break
                    assert time.monotonic() - t0 < 1.0, f"replica B still accepts the revoked {who} token"
                    time.sleep(0.02)
        finally:
            b.stop()
            a.stop()
    finally:
        pg.drop()
