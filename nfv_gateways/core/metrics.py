"""A gateway instance's Prometheus exposition (prometheus_client: HELP and TYPE lines, escaped labels), read from
its status at each scrape, and the small HTTP server that serves it on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from tianji import metrics_http

if TYPE_CHECKING:
    from nfv_gateways.core.instance import Instance


def exposition(gw: Instance) -> bytes:
    registry = CollectorRegistry()
    registry.register(StatusCollector(gw))
    return generate_latest(registry)


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
              ("tianji_gateway_lb_pools", "load-balancer pools (listeners) served", "pools"))
    HELD = (("tianji_gateway_dataplane_vpcs", "VPCs the native data plane holds", "vpcs"),
            ("tianji_gateway_dataplane_endpoints", "endpoints the native data plane holds", "endpoints"))

    def __init__(self, gw: Instance) -> None:
        self.gw = gw

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        st, name = self.gw.status(), self.gw.o.name
        gauges = [(m, h, st[k]) for m, h, k in self.GAUGES if k in st] + \
            [(m, h, st["dataplane_held"][k]) for m, h, k in self.HELD if k in st.get("dataplane_held", {})]
        for metric, help_, value in (*gauges, ("tianji_gateway_eips", "EIPs homed here", len(st["eips"]))):
            g = GaugeMetricFamily(metric, help_, labels=["gateway"])
            g.add_metric([name], value)
            yield g
        sources = [(m, h, st.get(k) or {}) for m, h, k in self.COUNTERS]
        if st.get("nat_native"):
            sources.append(("tianji_gateway_fastpath", "the C NAT fast path's counters", st["nat_native"]))
        for metric, help_, values in sources:
            c = CounterMetricFamily(metric, help_, labels=["gateway", "counter"])
            for k, v in sorted(values.items()):
                c.add_metric([name, k], v)
            yield c
