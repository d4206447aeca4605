"""Topology files: the shipped ones load; `dpdk_hypervisors` (hosts brought up on OVS-DPDK) names only the file's
own hypervisors; the OVS-DPDK settings keep the EAL and the poll-mode thread apart and let an idle PMD sleep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from topologies.cluster_state import TOPOLOGIES, load_topology
from topologies.dpdk_host import dpdk_config


@pytest.mark.parametrize("name", sorted(p.stem for p in TOPOLOGIES.glob("*.json")))
def test_the_shipped_topologies_load(name: str) -> None:
    assert load_topology(name)["hypervisors"]


def test_dpdk_hypervisors_must_be_the_files_own(tmp_path: Path) -> None:
    topo = json.loads((TOPOLOGIES / "small.json").read_text())
    good = tmp_path / "good.json"
    good.write_text(json.dumps(topo | {"dpdk_hypervisors": ["hv3"]}))
    assert load_topology(str(good))["dpdk_hypervisors"] == ["hv3"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(topo | {"dpdk_hypervisors": ["hv3", "hv9"]}))
    with pytest.raises(SystemExit, match="hv9"):
        load_topology(str(bad))


def test_dpdk_settings(tmp_path: Path) -> None:
    c = dpdk_config(tmp_path, "tj-hv3")
    assert c["dpdk-init"] == "true" and int(c["pmd-maxsleep"]) > 0
    assert f"--huge-dir={tmp_path}" in c["dpdk-extra"] and "--file-prefix=tj-hv3" in c["dpdk-extra"]
    assert "--no-pci" in c["dpdk-extra"]
    assert int(c["dpdk-socket-mem"]) <= int(c["dpdk-socket-limit"])
