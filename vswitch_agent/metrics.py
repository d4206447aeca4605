"""The agent's Prometheus exposition (prometheus_client), read from its state at each scrape and served by
tianji/metrics_http.py (`--metrics-port`, on 127.0.0.1 unless told otherwise): flows by table, reconcile passes,
flow mods and time, errors, revision lag, packet-ins, the switch connection and the controller stream."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tianji import metrics_http
from vswitch_agent import pipeline as P

TABLE_NAMES = {t.id: t.name for t in P.TABLES}


class AgentCollector:
    """`status()`: the agent's state dict (the one its status file writes); `flows()`: the flows it wants."""

    COUNTERS = (("tianji_agent_reconcile_passes", "Reconcile passes run", "passes"),
                ("tianji_agent_errors", "Errors met (each also logged, the last in the status file)", "errors"),
                ("tianji_agent_audit_repairs", "Flows the audit found wrong in the switch and repaired",
                 "audit_repairs"),
                ("tianji_agent_whole_configs", "Whole configs taken (not deltas)", "whole_configs"),
                ("tianji_agent_switch_connects", "OpenFlow connections from the switch", "connects"))
    GAUGES = (("tianji_agent_desired_revision", "The revision of the config the agent holds", "desired_revision"),
              ("tianji_agent_applied_revision", "The revision the switch was last brought to", "revision"),
              ("tianji_agent_last_reconcile_duration_seconds",
               "How long the last change took to reach the switch", "last_change_s"))

    def __init__(self, host: str, status: Callable[[], dict[str, Any]], flows: Callable[[], Iterable[Any]]) -> None:
        self.host, self.status, self.flows = host, status, flows

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        st = self.status()
        st = st | {"last_change_s": st["last_change_ms"] / 1000 if st.get("last_change_ms") is not None else None}
        for name, doc, key in self.COUNTERS:
            yield CounterMetricFamily(name, doc, value=float(st.get(key) or 0))
        for name, doc, key in self.GAUGES:
            if st.get(key) is not None:
                yield GaugeMetricFamily(name, doc, value=float(st[key]))
        lag = (st.get("desired_revision") or 0) - (st.get("revision") or 0)
        yield GaugeMetricFamily("tianji_agent_revision_lag", "Revisions the switch is behind the config held",
                                value=float(max(0, lag)))
        mods = CounterMetricFamily("tianji_agent_flow_mods", "Flow mods sent to the switch", labels=["op"])
        mods.add_metric(["add"], float(st.get("flow_adds", 0)))
        mods.add_metric(["delete"], float(st.get("flow_deletes", 0)))
        yield mods
        ins = CounterMetricFamily("tianji_agent_packet_ins", "Packets the switch sent the agent, by what they were",
                                  labels=["kind"])
        for kind, n in sorted(st.get("packet_ins", {}).items()):
            ins.add_metric([kind], float(n))
        yield ins
        by_table = Counter(TABLE_NAMES.get(f.table, str(f.table)) for f in self.flows())
        flows = GaugeMetricFamily("tianji_agent_flows", "Flows the agent wants in the switch, by table",
                                  labels=["table"])
        for table in TABLE_NAMES.values():
            flows.add_metric([table], float(by_table.get(table, 0)))
        yield flows
        for name, doc, key in (("tianji_agent_switch_connected", "1 while the switch is connected",
                                "switch_connected"),
                               ("tianji_agent_streaming", "1 while the controller's config stream is open",
                                "streaming")):
            yield GaugeMetricFamily(name, doc, value=1.0 if st.get(key) else 0.0)


def exposition(collector: AgentCollector) -> bytes:
    return generate_latest(metrics_http.registry(collector))


def serve(collector: AgentCollector, port: int, address: str = "127.0.0.1") -> None:
    metrics_http.serve(lambda: exposition(collector), port, address)
