"""Hardening III: each finding of the third review (the API side), on both backends where a database is involved;
each of these failed before its fix."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Controller


@pytest.mark.parametrize("where", ["empty", "path"])
def test_sqlite_files_are_private_whatever_the_setting(tmp_path: Path, where: str) -> None:
    """TIANJI_DATABASE_URL set but empty means unset (the state directory's tianji.db); a sqlite:/// path of one's
    own is private too: the database, its -wal and -shm files 0600 (it holds token hashes and MD5 keys)."""
    url = "" if where == "empty" else f"sqlite:///{tmp_path / 'elsewhere' / 'my.db'}"
    code = ("from controller.app import create_app; a = create_app(announce_token=False); "
            "a.state.db.engine.connect().close()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env=os.environ | {"TIANJI_STATE_DIR": str(tmp_path / "state"), "TIANJI_DATABASE_URL": url})
    assert r.returncode == 0, r.stderr
    db = tmp_path / "state" / "tianji.db" if where == "empty" else tmp_path / "elsewhere" / "my.db"
    files = [f for f in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")) if f.exists()]
    assert db in files and not (tmp_path / "tianji.db").exists()
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f


def test_an_empty_setting_is_unset(tmp_path: Path) -> None:
    from controller.settings import Settings

    s = Settings.from_env(state_dir=tmp_path, database_url="")
    assert s.database_url is None and s.sqlite_path == tmp_path / "tianji.db"
    os.environ["TIANJI_DATABASE_URL"] = ""
    try:
        assert Settings(state_dir=tmp_path).database_url is None
    finally:
        del os.environ["TIANJI_DATABASE_URL"]
