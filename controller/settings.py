"""Controller settings: one place for every knob, read from the environment and the CLI."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


def default_state_dir() -> Path:
    if env := os.environ.get("TIANJI_STATE_DIR"):
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/tianji")
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "tianji"


@dataclass
class Settings:
    state_dir: Path = field(default_factory=default_state_dir)
    database_url: str | None = None
    vni_min: int = 1000
    vni_max: int = 16_777_215
    host_down_after: float = 15.0  # seconds of heartbeat silence before a host is marked down
    gateway_down_after: float = 2.0  # gateways heartbeat every 0.5 s; their EIPs move when they fall silent
    max_watch_timeout: float = 60.0
    # during a burst of writes (Broadcaster.busy) a woken watch waits this long for more before compiling. Off by
    # default: a watch has one compile in flight, and what lands meanwhile is in the agent's next answer anyway,
    # so the wait only added its own length to every answer at a few hundred creates/s
    watch_coalesce: float = 0.0
    eip_pool: str | None = None

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        s = cls()
        if v := os.environ.get("TIANJI_DATABASE_URL"):
            s.database_url = v
        if v := os.environ.get("TIANJI_VNI_RANGE"):
            lo, _, hi = v.partition("..")
            s.vni_min, s.vni_max = int(lo), int(hi)
        if v := os.environ.get("TIANJI_HOST_DOWN_AFTER"):
            s.host_down_after = float(v)
        if v := os.environ.get("TIANJI_GATEWAY_DOWN_AFTER"):
            s.gateway_down_after = float(v)
        for k, v in overrides.items():
            if v is not None:
                setattr(s, k, v)
        s.state_dir = Path(s.state_dir)
        return s

    @property
    def url(self) -> str:
        return self.database_url or f"sqlite:///{self.state_dir / 'tianji.db'}"
