"""Telemetry on the emulated cluster: every agent serves its Prometheus metrics, and they tell the truth about its
switch (flows by table, revision lag, the connection, the stream, packet-ins)."""

from __future__ import annotations

import subprocess
import sys

from prometheus_client.parser import text_string_to_metric_families

from tests.scenarios.conftest import wait_for
from topologies.machines import AGENT_METRICS_PORT

SCRAPE = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{AGENT_METRICS_PORT}/metrics', " \
         "timeout=5).read().decode())"


def agent_metrics(cluster, host: str) -> dict[str, dict[tuple, float]]:
    ns = cluster.state.hypervisors[host]["ns"]
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", SCRAPE], capture_output=True, text=True,
                         timeout=10, check=True).stdout
    return {f.name: {tuple(sorted(s.labels.items())): s.value for s in f.samples}
            for f in text_string_to_metric_families(out)}


def test_agents_serve_metrics_that_match_their_switch(cluster, tenants) -> None:
    a = tenants()
    a.vpc("prod", "10.0.0.0/16", {"s": "10.0.1.0/24"})
    a.vm("s", "hv1", dhcp=True)  # its DHCP request is a packet-in
    a.vm("s", "hv2")
    cluster.wait_converged()
    for host in cluster.state.hypervisors:
        m = agent_metrics(cluster, host)
        assert m["tianji_agent_switch_connected"][()] == 1, host
        assert m["tianji_agent_streaming"][()] == 1, host
        assert m["tianji_agent_revision_lag"][()] == 0, host
        assert m["tianji_agent_errors"][()] >= 0
        flows = {dict(k)["table"]: v for k, v in m["tianji_agent_flows"].items()}
        assert flows["classify"] >= 1 and set(flows) >= {"forward", "routing", "egress_acl", "deliver"}
    m = agent_metrics(cluster, "hv1")
    flows = {dict(k)["table"]: v for k, v in m["tianji_agent_flows"].items()}
    assert flows["forward"] >= 2  # the two ports of the VPC: one here, one over the tunnel
    wait_for(lambda: agent_metrics(cluster, "hv1")["tianji_agent_packet_ins"].get((("kind", "dhcp"),), 0) >= 1, 5,
             "the DHCP request counted")
    assert m["tianji_agent_reconcile_passes"][()] >= 1
    assert m["tianji_agent_flow_mods"][(("op", "add"),)] > 0
