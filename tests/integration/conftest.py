"""A controller and two emulated hypervisors (private OVS + tianji agent each) for agent integration tests."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import Controller
from tianji.api_client import Client
from topologies.hosts import Fabric
from topologies.machines import Hypervisor, Vm


def wait_for(cond: Callable[[], object], timeout: float, what: str, interval: float = 0.05) -> float:
    start = time.monotonic()
    while True:
        if cond():
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@dataclass
class Cluster:
    controller: Controller
    fabric: Fabric
    hv: dict[str, Hypervisor]
    tenant: Client
    vpc: dict
    subnets: list[dict]

    def converged(self, hv: Hypervisor) -> bool:
        st = self.fabric.agent_status(hv)
        want = self.controller.admin.get(f"/v1/hosts/{hv.name}/config")["revision"]
        return st.get("revision") == want and st.get("switch_connected") and st.get("switch_synced")

    def switch_matches(self, hv: Hypervisor) -> tuple[int, int]:
        """(missing, extra): the switch's flows against the flows computed from scratch."""
        want, have, _ = hv.against_computed(self.controller.admin.get(f"/v1/hosts/{hv.name}/config"),
                                            self.fabric.base / "agents" / f"zones-{hv.name}.json")
        return len(want - have), len(have - want)

    def wait_converged(self, timeout: float = 15) -> None:
        for hv in self.hv.values():
            wait_for(lambda hv=hv: self.converged(hv), timeout, f"agent {hv.name} to converge")

    def vm(self, name: str, host: str, subnet: int = 0, dhcp: bool = False, **port_kw) -> Vm:
        sn = self.subnets[subnet]
        port = self.tenant.post("/v1/ports", {"subnet_id": sn["id"], "name": name} | port_kw)
        port = self.controller.orchestrator().patch(f"/v1/ports/{port['id']}", {"host": host})
        return self.fabric.add_vm(name, self.hv[host], port | {"gateway_ip": sn["gateway_ip"]}, dhcp=dhcp)

    def ping_no_loss(self, src: Vm, dst_ip: str, during: Callable[[], None]) -> None:
        """100 pings at 20 ms while `during` runs: every one must be answered."""
        ping = src.popen("ping", "-c", "100", "-i", "0.02", "-W", "1", dst_ip, stdout=subprocess.PIPE, text=True)
        time.sleep(0.3)
        during()
        out, _ = ping.communicate(timeout=60)
        m = re.search(r"(\d+) packets transmitted, (\d+) received", out)
        assert m and m.group(1) == m.group(2) == "100", out

    def ping(self, src: Vm, dst_ip: str, count: int = 3, interval: float = 0.2) -> bool:
        r = src.exec("ping", "-c", str(count), "-i", str(interval), "-W", "1", dst_ip, check=False)
        return r.returncode == 0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    ctl = Controller(tmp_path / "state", None, listen="0.0.0.0", host_down_after=6)
    fabric = Fabric()
    cluster = None
    try:
        hvs = {n: fabric.add_hypervisor(n) for n in ("hv1", "hv2")}
        for h in hvs.values():
            fabric.start_agent(h, ctl.port, ctl.host_token(h.name))
        wait_for(lambda: len(ctl.admin.get("/v1/hosts")) == 2, 20, "both agents to register")
        t = ctl.tenant("acme")
        vpc = t.post("/v1/vpcs", {"name": "prod", "cidr": "10.0.0.0/16"})
        subnets = [t.post("/v1/subnets", {"vpc_id": vpc["id"], "name": f"s{i}", "cidr": f"10.0.{i}.0/24"})
                   for i in (1, 2)]
        cluster = Cluster(ctl, fabric, hvs, t, vpc, subnets)
        yield cluster
    finally:
        for h in fabric.hypervisors.values():
            log = fabric.base / f"agent-{h.name}.log"
            if log.exists():
                print(f"--- {log} (tail) ---\n" + log.read_text()[-3000:])
        fabric.teardown()
        (cluster.controller if cluster else ctl).stop()
