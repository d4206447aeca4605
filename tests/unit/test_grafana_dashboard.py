"""The Grafana dashboard in docs/grafana names only metrics the components export: every series in every panel's
expression is one the controller (a served app, scraped), the agents (their collector) or the gateway instances
(their collector, over each role's status) export; every panel has a unit; the gateways have panels."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from nfv_gateways.core.metrics import StatusCollector
from tests.support.controller import Controller
from tianji import metrics_http
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


class FakeInstance:
    """What StatusCollector reads of an instance: its name and its status (one per role, as each writes it)."""

    def __init__(self, status: dict) -> None:
        self.o = type("Options", (), {"name": "gw1"})()
        self._status = status

    def status(self) -> dict:
        return self._status


def gateway_series() -> set[str]:
    base = {"eips": ["203.0.113.1"], "counters": {"in": 5, "out": 4, "drop_malformed": 1},
            "dataplane": {"rx": 5, "drop_no_rule": 1}, "dataplane_held": {"vpcs": 1, "endpoints": 1}}
    roles = [{"role": "nat", "mappings": 3, "nat": {"mappings_created": 3}, "nat_native": {"hits": 2}},
             {"role": "lb", "connections": 2, "pools": 1, "lb": {"new": 2}},
             {"role": "service", "endpoints": 1, "connections": 1, "service": {"new": 1}},
             {"role": "private-line", "lines": [{"id": "L1", "sessions": [
                 {"customer_ip": "192.0.2.1", "bgp_state": "Established", "learned": ["10.9.0.0/16"]}]}]}]
    return {n for r in roles for n in exported(generate_latest(metrics_http.registry(
        StatusCollector(FakeInstance(base | r)))).decode())}  # type: ignore[arg-type]


def test_every_expression_names_an_exported_series(tmp_path: Path) -> None:
    c = Controller(tmp_path / "state", None)
    try:
        c.tenant()
        c.admin.post("/v1/hosts", {"name": "hv1", "vtep_ip": "172.31.0.1"})  # hosts by status have a sample
        r = c.raw(c.admin_token).get("/metrics")
        names = exported(r.text) | agent_series() | gateway_series()
    finally:
        c.stop()
    # histograms' buckets have samples only once observed: their family's three series exist from the start
    names |= {f"tianji_controller_{h}_duration_seconds{s}" for h in ("compile", "watch")
              for s in ("_bucket", "_count", "_sum")}
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert exprs
    used = {m for e in exprs for m in re.findall(r"\b((?:tianji|process)_[a-z0-9_]+)", e)}
    missing = sorted(used - names)
    assert missing == [], f"the dashboard names series nothing exports: {missing}"
    for part in ("tianji_agent", "tianji_controller", "tianji_gateway", "tianji_gateway_bgp", "process_"):
        assert {n for n in used if n.startswith(part)}, f"no panel shows {part}*"
    for p in dash["panels"]:
        assert p["title"] and p["targets"], p
        assert p.get("fieldConfig", {}).get("defaults", {}).get("unit"), f"panel {p['title']!r} has no unit"
