"""Controller replicas: two controllers on PostgreSQL, every agent and gateway given both URLs (the session's
cluster runs so whenever PostgreSQL is there, as in CI). Each round kills -9 the replica that leads and that every
host watches, under a 10 ms ping between two hypervisors and through the NAT gateway, while a tenant writes
through the other; then brings it back, and the next round kills the other (tests/support/replicas.py)."""

from __future__ import annotations

import os

import pytest

from tests.scenarios.conftest import reach
from tests.scenarios.nat_support import nat_vpc, nat_works, served
from tests.support.replicas import kill_round

ROUNDS = int(os.environ.get("TIANJI_REPLICA_ROUNDS", "10"))


def test_replicas_1_kill_the_leader_ten_times(cluster, tenants, internet) -> None:
    if len(cluster.state.controllers) < 2:
        pytest.fail("this scenario needs two controller replicas, which need PostgreSQL: run with TIANJI_TEST_PG=1 "
                    "and PostgreSQL at 127.0.0.1:5432 (scripts/run-tests.sh does when it answers)")
    n, eip, _gw = nat_vpc(tenants, subnet="10.0.1.0/24")
    writes = n.client.post("/v1/subnets", {"vpc_id": n.vpcs["prod"]["id"], "name": "w", "cidr": "10.0.64.0/18"})
    a, b = n.vm("s", "hv1"), n.vm("s", "hv2")
    nat_works(cluster, a, internet, eip["address"])
    assert reach(cluster, a, b["ip"])
    token = n.client.token
    pings = {"hv1->hv2": (a["ns"], b["ip"]), "hv1->NAT->internet": (a["ns"], internet["ip"])}
    for r in range(ROUNDS):
        got = kill_round(cluster, token, writes["id"], (n.subnets["s"]["id"], "hv3"), pings, f"r{r}",
                         lambda: served(cluster))
        where = f"round {r + 1} (killed replica {got.killed}): {got}"
        print(where)
        assert got.watch_moved_s < 3.0, where
        assert got.liveness_s < 5.0, where
        assert all(lost == 0 for _sent, lost in got.pings.values()), where
        assert got.writes > 0 and got.writes_lost == 0 and not got.writes_failed, where
        assert not got.hosts_down and not got.eips_moved, where
        assert not got.whole_configs, where  # every host resumed its watch from its revision
        assert got.rejoined_as == "follower", where
        nat_works(cluster, a, internet, eip["address"])
