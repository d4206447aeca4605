"""Upgrading a database that holds data: migration 0004 keeps every tenant's token working, loses no row that
refers to a rebuilt table, and moves VNI allocation past the VNIs in use."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, select, text

from controller.auth import token_hash
from controller.state import models as m
from controller.state.db import Database
from controller.state.schema import MIGRATIONS


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


def test_0008_moves_snat_eips_to_rows_in_order_once_each(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    engine = create_engine(url)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    t0 = "'2026-01-01 00:00:00'"
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0007")
        conn.execute(text(f"INSERT INTO tenants (id, name, created_at) VALUES ('t1', 'acme', {t0})"))
        conn.execute(text("INSERT INTO vpcs (id, tenant_id, name, cidr, vni, router_mac, created_at, revision, mtu) "
                          f"VALUES ('v1', 't1', 'v', '10.0.0.0/16', 1234, '02:00:00:00:04:d2', {t0}, 0, 1450)"))
        conn.execute(text(f"INSERT INTO eip_pools (id, cidr, created_at) VALUES ('p1', '198.51.100.0/24', {t0})"))
        for i in (1, 2, 3):
            conn.execute(text(f"INSERT INTO eips (id, tenant_id, pool_id, address, created_at) VALUES "
                              f"('e{i}', 't1', 'p1', '198.51.100.{i}', {t0})"))
        conn.execute(text(f"INSERT INTO nat_gateways (id, tenant_id, vpc_id, name, created_at) "
                          f"VALUES ('g1', 't1', 'v1', 'nat', {t0})"))
        conn.execute(text("INSERT INTO snat_rules (id, nat_gateway_id, subnet_id, cidr, eip_ids) "
                          "VALUES ('r1', 'g1', NULL, '10.0.1.0/24', 'e3,e1,e3,e2')"))
        conn.execute(text("INSERT INTO host_tokens (id, name, token_hash, host, kind, created_at) VALUES "
                          f"('h1', 'gw1', 'x', 'gw1', 'gateway', {t0})"))
    engine.dispose()
    db = Database(url)
    db.migrate()
    with db.read() as s:
        rows = s.execute(select(m.SnatRuleEip.eip_id).where(m.SnatRuleEip.rule_id == "r1")
                         .order_by(m.SnatRuleEip.position)).scalars().all()
        assert rows == ["e3", "e1", "e2"]  # the repeat kept once, in its first place
        assert s.execute(select(m.SnatRule.cidr)).scalar_one() == "10.0.1.0/24"
        assert s.execute(select(m.HostToken.role)).scalar_one() is None  # bound at its host's first registration
