"""A bulk TCP transfer through a service instance on each native fast path (bench/services.py's lab: the endpoint's
VM on a kernel VXLAN stand-in, the service behind the instance), then new connections through the same instance.
DPDK's af_xdp ports once shared one mbuf pool, and after a bulk transfer whose receiver ran on another core the
uplink stopped receiving: the transfer's last segments and every later SYN were lost. On `xdp` the bulk of each
transfer is the XDP flow cache's, from its ninth packet each way."""

from __future__ import annotations

import time

import pytest

from bench.services import iperf, up
from topologies.gwlab import GatewayLab

PATHS = ["dpdk", "xdp", "packet"]


@pytest.mark.parametrize("fastpath", PATHS)
def test_bulk_transfer_then_new_connections(fastpath: str) -> None:
    lab = GatewayLab(f"tjb{PATHS.index(fastpath)}")
    try:
        target = up(lab, "tianji", fastpath)
        assert lab.status()["fastpath"].split()[0] == fastpath
        for run in range(3):  # each run is a new control and data connection after the previous bulk one
            t0 = time.monotonic()
            bits = iperf(lab, target, 1.5, 1)
            took = time.monotonic() - t0
            assert bits > 50e6, f"run {run} on {fastpath}: {bits / 1e6:.0f} Mbit/s"
            assert took < 15, f"run {run} on {fastpath} took {took:.1f} s (a 1.5 s transfer): frames were stuck"
        dp = lab.status()["dataplane"]
        if fastpath == "xdp":  # after their first packets in C, the XDP flow cache carried them (tj_xdp.bpf.c)
            assert dp["xdp_carried"] > 10_000 and dp["svc_out"] >= 8 and dp["svc_in"] >= 8, dp
        else:
            assert dp["svc_out"] > 10_000 and dp["svc_in"] > 100, dp  # the established connections stayed in C
    finally:
        lab.down()
