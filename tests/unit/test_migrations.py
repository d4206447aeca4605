"""Upgrading a database that holds data: migration 0004 keeps every tenant's token working, loses no row that
refers to a rebuilt table, and moves VNI allocation past the VNIs in use."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, select, text

from controller import models as m
from controller.auth import token_hash
from controller.db import MIGRATIONS, Database


def test_0004_keeps_tenant_tokens_and_vnis(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    engine = create_engine(url)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0003")
        conn.execute(text("INSERT INTO tenants (id, name, token_hash, created_at) VALUES "
                          "('t1', 'acme', :h, '2026-01-01 00:00:00')"), {"h": token_hash("tjt_old")})
        conn.execute(text("INSERT INTO vpcs (id, tenant_id, name, cidr, vni, router_mac, created_at, revision) "
                          "VALUES ('v1', 't1', 'v', '10.0.0.0/16', 1234, '02:00:00:00:04:d2', "
                          "'2026-01-01 00:00:00', 0)"))
        conn.execute(text("INSERT INTO host_tokens (id, name, token_hash, created_at) VALUES "
                          "('h1', 'agents', 'x', '2026-01-01 00:00:00')"))
    engine.dispose()
    db = Database(url)
    db.migrate()
    with db.read() as s:
        tok = s.execute(select(m.TenantToken)).scalar_one()
        assert (tok.tenant_id, tok.token_hash) == ("t1", token_hash("tjt_old"))
        assert s.execute(select(m.Counter.value).where(m.Counter.name == "vni")).scalar() == 1234
        # the tenants table was rebuilt (SQLite drops a column by copying): nothing that refers to it went with it
        assert s.execute(select(m.Vpc.id)).scalars().all() == ["v1"]
        old = s.execute(select(m.HostToken)).scalar_one()
        assert (old.host, old.kind) == (None, "hypervisor")  # refused at use: it names no host
