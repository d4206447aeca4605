"""A restore on the running emulated cluster (docs/operations.md, Backup and restore): the controller backed up
while it serves, a VPC made after the backup, then every controller replica stopped, the backup restored and the
replicas started again under a ping between two VMs of the VPC the backup holds. That ping loses nothing; every agent
takes the restored state as one delta (no whole config), and its switch then holds exactly the flows computed
from it: the later VPC's VMs no longer reach each other, and the VNI it had is not handed out again."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

from tests.scenarios.conftest import reach
from tests.support.wait import wait_for
from topologies.cluster import TIANJI


def _controller_cli(cluster, *args: str) -> subprocess.CompletedProcess:
    rep = cluster.state.controllers[0]
    cmd = [TIANJI, "controller", *args, "--state-dir", rep["dir"]]
    if cluster.state.database_url:
        cmd += ["--database-url", cluster.state.database_url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def _flows_as_computed(cluster, hv: str) -> bool:
    cfg = cluster.admin.get(f"/v1/hosts/{hv}/config")
    zones = Path(cluster.state.dir) / "agents" / f"zones-{hv}.json"
    want, have, _ = cluster.hypervisor(hv).against_computed(cfg, zones)
    return want == have


def test_a_restore_under_traffic(cluster, tenants, tmp_path: Path) -> None:
    a = tenants()
    a.vpc("kept", "10.60.0.0/16", {"k": "10.60.1.0/24"})
    k1, k2 = a.vm("k", "hv1"), a.vm("k", "hv2")
    assert reach(cluster, k1, k2["ip"])
    r = _controller_cli(cluster, "backup", str(tmp_path / "cluster.tjbackup"))
    assert r.returncode == 0, r.stderr

    later = a.vpc("later", "10.61.0.0/16", {"l": "10.61.1.0/24"})
    l1, l2 = a.vm("l", "hv1"), a.vm("l", "hv2")
    assert reach(cluster, l1, l2["ip"])
    cluster.wait_converged()
    hvs = list(cluster.state.hypervisors)
    whole = {h: cluster.agent_status(h)["whole_configs"] for h in hvs}

    ping = subprocess.Popen(["ip", "netns", "exec", k1["ns"], "ping", "-c", "500", "-i", "0.02", "-W", "1",
                             k2["ip"]], stdout=subprocess.PIPE, text=True)
    replicas = range(len(cluster.state.controllers))
    for i in replicas:  # every replica: a restore refuses while any serves the database
        cluster.kill_controller(i, signal.SIGTERM)
    r = _controller_cli(cluster, "restore", str(tmp_path / "cluster.tjbackup"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert str(later["vni"]) in r.stdout  # its VNI rests in quarantine, and the restore says so
    for i in replicas:
        cluster.start_controller(i)
    cluster._admin(wait=True)
    out, _ = ping.communicate(timeout=60)
    m = re.search(r"(\d+) packets transmitted, (\d+) received", out)
    assert m and m.group(1) == m.group(2) == "500", out  # the kept VPC's traffic never noticed

    assert {v["name"] for v in a.client.get("/v1/vpcs")} == {"kept"}
    cluster.wait_converged()
    for hv in hvs:
        wait_for(lambda hv=hv: _flows_as_computed(cluster, hv), 15, f"{hv}'s switch holding the restored flows")
    assert {h: cluster.agent_status(h)["whole_configs"] for h in hvs} == whole, "one delta each, no whole config"
    assert reach(cluster, k1, k2["ip"])
    assert not reach(cluster, l1, l2["ip"])  # the later VPC is gone from every switch
    again = a.vpc("again", "10.62.0.0/16", {"g": "10.62.1.0/24"})
    assert again["vni"] != later["vni"]
