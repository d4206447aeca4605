"""The agent's conntrack zones (vswitch_agent/host.py ZoneMap): stable across restarts, distinct, and only for the
VPCs with ports on the host now (a VPC that left is forgotten, so tenants' churn does not grow the map or its file)."""

from __future__ import annotations

import json
from pathlib import Path

from vswitch_agent.host import ZoneMap


def test_zones_are_kept_across_restarts_and_forgotten_when_a_vpc_leaves(tmp_path: Path) -> None:
    f = tmp_path / "zones-hv1.json"
    zm = ZoneMap(f)
    vnis = {"a": 1000, "b": 1000 + 65521, "c": 2000}  # a and b map to the same zone first: b moves on
    z = zm.assign({"a", "b"}, vnis)
    assert len(set(z.values())) == 2
    assert ZoneMap(f).assign({"a", "b"}, vnis) == z  # a restarted agent: the same zones
    for i in range(50):  # churn: VPCs come and go
        zm.assign({"a", "b", f"v{i}"}, vnis | {f"v{i}": 3000 + i})
    later = zm.assign({"a", "b", "c"}, vnis)
    assert later["a"] == z["a"] and later["b"] == z["b"]
    assert set(json.loads(f.read_text())) == {"a", "b", "c"}
