"""The Grafana dashboard in docs/grafana names only metrics the components export: every series in every panel's
expression is one the controller (a served app, scraped), the agents (their collector) or the gateways export."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.controller import Controller
from vswitch_agent.flow import Flow
from vswitch_agent.metrics import AgentCollector

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "tianji.json"
SUFFIXES = ("_bucket", "_count", "_sum", "_total")


def exported(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def agent_series() -> set[str]:
    state = {"passes": 3, "errors": 0, "audit_repairs": 0, "whole_configs": 1, "connects": 1, "revision": 7,
             "desired_revision": 7, "last_change_ms": 4.0, "flow_adds": 10, "flow_deletes": 2,
             "packet_ins": {"dhcp": 1}, "switch_connected": True, "streaming": True}
    reg = CollectorRegistry()
    reg.register(AgentCollector("hv1", lambda: state, lambda: [Flow(0, 0, (), ())]))
    return exported(generate_latest(reg).decode())


def test_every_expression_names_an_exported_series(tmp_path: Path) -> None:
    c = Controller(tmp_path / "state", None)
    try:
        c.tenant()
        c.admin.post("/v1/hosts", {"name": "hv1", "vtep_ip": "172.31.0.1"})  # hosts by status have a sample
        r = c.raw(c.admin_token).get("/metrics")
        names = exported(r.text) | agent_series()
    finally:
        c.stop()
    # histograms' buckets have samples only once observed: their family's three series exist from the start
    names |= {f"tianji_controller_compile_duration_seconds{s}" for s in ("_bucket", "_count", "_sum")}
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert exprs
    used = {m for e in exprs for m in re.findall(r"\b(tianji_[a-z0-9_]+)", e)}
    missing = sorted(used - names)
    assert missing == [], f"the dashboard names series nothing exports: {missing}"
    assert {n for n in used if n.startswith("tianji_agent")} and {n for n in used if n.startswith("tianji_controller")}
    for p in dash["panels"]:
        assert p["title"] and p["targets"], p
