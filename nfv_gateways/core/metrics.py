"""A gateway instance's Prometheus exposition (prometheus_client: HELP and TYPE lines, escaped labels), read from
its status at each scrape, and the small HTTP server that serves it on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tianji import metrics_http

if TYPE_CHECKING:
    from nfv_gateways.core.instance import Instance


def exposition(gw: Instance) -> bytes:
    return generate_latest(metrics_http.registry(StatusCollector(gw)))


def serve(gw: Instance, port: int) -> None:
    metrics_http.serve(lambda: exposition(gw), port)


class StatusCollector:
    """The instance's status as metric families, read at each scrape (one source: `Instance.status`)."""

    COUNTERS = (("tianji_gateway_packets", "the instance's packet and control counters", "counters"),
                ("tianji_gateway_nat", "the NAT table's counters (the Python reference)", "nat"),
                ("tianji_gateway_lb", "the load balancer's counters: connection table (hits, new, fallback, "
                                      "misses) and the Python stage's drops", "lb"),
                ("tianji_gateway_dataplane", "the native data plane's counters", "dataplane"))
    GAUGES = (("tianji_gateway_mappings", "NAT mappings held", "mappings"),
              ("tianji_gateway_lb_connections", "load-balancer connections held", "connections"),
              ("tianji_gateway_lb_pools", "load-balancer pools (listeners) served", "pools"),
              ("tianji_gateway_service_endpoints", "service endpoints served", "endpoints"))
    HELD = (("tianji_gateway_dataplane_vpcs", "VPCs the native data plane holds", "vpcs"),
            ("tianji_gateway_dataplane_endpoints", "endpoints the native data plane holds", "endpoints"))

    def __init__(self, gw: Instance) -> None:
        self.gw = gw

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        st, name = self.gw.status(), self.gw.o.name
        gauges = [(m, h, st[k]) for m, h, k in self.GAUGES if k in st] + \
            [(m, h, st["dataplane_held"][k]) for m, h, k in self.HELD if k in st.get("dataplane_held", {})]
        if st.get("role") == "service" and "connections" in st:  # a service instance's connections, not an LB's
            gauges = [g for g in gauges if g[0] != "tianji_gateway_lb_connections"] + \
                [("tianji_gateway_service_connections", "service connections held", st["connections"])]
        for metric, help_, value in (*gauges, ("tianji_gateway_eips", "EIPs homed here", len(st["eips"]))):
            g = GaugeMetricFamily(metric, help_, labels=["gateway"])
            g.add_metric([name], value)
            yield g
        sources = [(m, h, st.get(k) or {}) for m, h, k in self.COUNTERS]
        if st.get("nat_native"):
            sources.append(("tianji_gateway_fastpath", "the C NAT fast path's counters", st["nat_native"]))
        if "service" in st:
            sources.append(("tianji_gateway_service", "the service stage's counters", st["service"]))
        for metric, help_, values in sources:
            c = CounterMetricFamily(metric, help_, labels=["gateway", "counter"])
            for k, v in sorted(values.items()):
                c.add_metric([name, k], v)
            yield c
        if "lines" in st:
            yield from _bgp(name, st["lines"])


def _bgp(name: str, lines: list[dict]) -> Iterator[GaugeMetricFamily]:
    """A private-line instance's BGP sessions: up or not, and the prefixes each learnt."""
    up = GaugeMetricFamily("tianji_gateway_bgp_session_up", "1 while a private line's BGP session is Established",
                           labels=["gateway", "line", "customer_ip"])
    learned = GaugeMetricFamily("tianji_gateway_bgp_learned_prefixes", "prefixes a private line's session learnt",
                                labels=["gateway", "line", "customer_ip"])
    for line in lines:
        for sess in line.get("sessions", []):
            labels = [name, line["id"], sess.get("customer_ip", "")]
            up.add_metric(labels, 1.0 if sess.get("bgp_state") == "Established" else 0.0)
            learned.add_metric(labels, float(len(sess.get("learned") or [])))
    yield up
    yield learned
