"""The plain fabric: hypervisors and VMs (topologies/machines.py) wired with bare namespaces and veths, for the
agent's integration tests and the benchmarks (the Mininet cluster wires the same machines for the scenarios).

Everything made is recorded in a state file, so `teardown()` (or a later run after a crash) removes exactly
what was created and nothing else. Processes are stopped by PID, never by name.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from topologies import netns
from topologies.machines import Hypervisor, Vm, ovs_pids, restart_ovs_daemon
from topologies.netns import sh

VENV_BIN = Path(sys.executable).parent


def read_status(path: Path) -> dict:
    """A status file an agent or gateway writes (atomically) for local tools; {} while there is none yet."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def check_prerequisites() -> None:
    """Root, iproute2, Open vSwitch: say what to install instead of failing obscurely."""
    problems = []
    if os.geteuid() != 0:
        problems.append("run as root (network namespaces and OVS need it)")
    for tool, pkg in (("ovs-vswitchd", "openvswitch-switch"), ("ovsdb-tool", "openvswitch-switch"),
                      ("ip", "iproute2"), ("ethtool", "ethtool"), ("dhclient", "isc-dhcp-client")):
        if shutil.which(tool) is None:
            problems.append(f"{tool} is missing: apt-get install {pkg} (or run `make setup`)")
    if problems:
        raise RuntimeError("emulated cluster prerequisites missing: " + "; ".join(problems))


def wait_gone(pid: int, deadline: float) -> bool:
    """Wait until process `pid` has exited or `deadline` (time.time()) has passed; whether it is gone."""
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


MGMT_POOL = ipaddress.IPv4Network("169.254.200.0/21")


def free_mgmt_net() -> ipaddress.IPv4Network:
    """A /30 of MGMT_POOL that no route of the root namespace covers or overlaps: a fixed one was unreachable
    when something else (a fabric left behind, another run) already routed it, and its replies went there."""
    used = []
    for line in sh("ip", "-4", "route", "show", "table", "all").stdout.splitlines():
        words = line.split()
        dest = words[1] if words and words[0] in ("local", "broadcast", "unicast") else (words or [""])[0]
        if dest[:1].isdigit():
            used.append(ipaddress.IPv4Network(dest, strict=False))
    # a route as or more specific than ours would win over it; a wider one (zeroconf's 169.254/16) loses
    used = [n for n in used if n.prefixlen >= 30]
    nets = list(MGMT_POOL.subnets(new_prefix=30))
    start = int.from_bytes(os.urandom(2), "big") % len(nets)
    for net in nets[start:] + nets[:start]:
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError(f"no free management /30 left in {MGMT_POOL}: remove stale tj* links (`ip -br link`)")


@dataclass
class Record:
    """What a run created: namespaces, root-namespace links, processes (pid files), directories."""

    path: Path
    netns: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({"netns": self.netns, "links": self.links, "pids": self.pids,
                                         "dirs": self.dirs}))

    @classmethod
    def load(cls, path: Path) -> Record:
        d = json.loads(path.read_text())
        return cls(path, d["netns"], d["links"], d["pids"], d["dirs"])

    def teardown(self) -> None:
        for pid in reversed(self.pids):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.time() + 3
        for pid in self.pids:
            if not wait_gone(pid, deadline):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for link in self.links:
            sh("ip", "link", "del", link, check=False)
        for ns in reversed(self.netns):
            sh("ip", "netns", "del", ns, check=False)
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)
        self.path.unlink(missing_ok=True)


class Fabric:
    """An underlay segment (a Linux bridge in its own namespace) and hypervisors hanging off it."""

    def __init__(self, tag: str | None = None, base: Path | None = None) -> None:
        check_prerequisites()
        self.tag = tag or os.urandom(2).hex()
        self.base = base or Path(f"/tmp/tianji-{self.tag}")
        self.base.mkdir(parents=True, exist_ok=True)
        self.rec = Record(self.base / "created.json", dirs=[str(self.base)])
        self.ul_ns = f"tj{self.tag}ul"
        self.hypervisors: dict[str, Hypervisor] = {}
        self.vms: dict[str, Vm] = {}
        self._ns(self.ul_ns)
        sh("ip", "link", "add", "br0", "type", "bridge", ns=self.ul_ns)
        sh("ip", "link", "set", "br0", "up", ns=self.ul_ns)

    def _ns(self, name: str) -> str:
        self.rec.netns.append(name)  # recorded first: a failure after the add still has it removed
        self.rec.save()
        return netns.add(name)

    def _record_pid(self, pid: int | None) -> None:
        if pid is not None:
            self.rec.pids.append(pid)
            self.rec.save()

    def add_hypervisor(self, name: str) -> Hypervisor:
        i = len(self.hypervisors) + 1
        ns = self._ns(f"tj{self.tag}h{i}")
        # management: a point-to-point veth to the root namespace, where the controller listens
        base_ip = free_mgmt_net().network_address
        hv = Hypervisor(name, ns, self.base / name, f"172.31.0.{i}/24", str(base_ip + 1))
        try:
            hv.start_ovs()
        finally:  # whatever started is recorded, so teardown stops it even if a later step failed
            for pid in ovs_pids(hv.rundir):
                if pid not in self.rec.pids:
                    self.rec.pids.insert(0, pid)
            self.rec.save()
        # underlay: a veth into the bridge namespace; the VTEP IP goes on br-phy (the agent puts it there)
        netns.veth("ul0", ns, f"ul-{i}", self.ul_ns)
        sh("ip", "link", "set", f"ul-{i}", "master", "br0", ns=self.ul_ns)
        root_if = f"tj{self.tag}m{i}"
        netns.veth(root_if, None, "mgmt0", ns)
        self.rec.links.append(root_if)
        self.rec.save()
        netns.address(None, root_if, f"{base_ip + 1}/30")
        netns.address(ns, "mgmt0", f"{base_ip + 2}/30")
        self.hypervisors[name] = hv
        return hv

    def start_agent(self, hv: Hypervisor, controller_port: int, token: str) -> int:
        pid = hv.start_agent(str(VENV_BIN / "tianji"), f"http://{hv.controller_ip}:{controller_port}", token,
                             self.base / "agents", self.base / f"agent-{hv.name}.log")
        self._record_pid(pid)
        return pid

    def stop_agent(self, hv: Hypervisor, sig: int = signal.SIGTERM) -> None:
        if hv.agent_pid:
            try:
                os.killpg(hv.agent_pid, sig)
            except ProcessLookupError:
                pass
            try:
                os.waitpid(hv.agent_pid, 0)
            except ChildProcessError:
                pass
            hv.agent_pid = None

    def restart_ovs(self, hv: Hypervisor, which: str = "ovs-vswitchd", sig: int = signal.SIGKILL) -> None:
        """Kill one of a hypervisor's OVS daemons (by its pid file) and start it again, as a crash and a restart
        by systemd would. ovs-vswitchd comes back with no flows; ovsdb-server with the database as it was."""
        old, new = restart_ovs_daemon(which, hv.ns, hv.rundir, sig)
        self.rec.pids = [new if p == old else p for p in self.rec.pids]
        self.rec.save()

    def agent_status(self, hv: Hypervisor) -> dict:
        return read_status(self.base / "agents" / f"agent-{hv.name}.json")

    def prepare_vm(self, name: str, hv: Hypervisor, mac: str) -> Vm:
        """The VM's namespace and veth, configured, not yet plugged into br-int."""
        ns = self._ns(f"tj{self.tag}{name}"[:15])
        tap = f"t{self.tag}{name}"[:15]
        netns.veth("eth0", ns, tap, hv.ns, a_mac=mac, up=False)
        vm = Vm(name, ns, hv, "", tap, mac)
        vm.configure()
        self.vms[name] = vm
        return vm

    def plug_vm(self, vm: Vm, port: dict, dhcp: bool = False) -> Vm:
        """Plug the way Nova/OVN do (iface-id names the port), then address it: statically or by DHCP."""
        vm.plug(port["id"])
        if dhcp:
            self._record_pid(vm.dhcp(self.base))
        else:
            vm.static(port["ip"], port.get("prefixlen", 24), port["gateway_ip"])
        vm.ip = port["ip"]
        return vm

    def add_vm(self, name: str, hv: Hypervisor, port: dict, dhcp: bool = False) -> Vm:
        """A VM for `port` on `hv`: prepared and plugged."""
        return self.plug_vm(self.prepare_vm(name, hv, port["mac"]), port, dhcp)

    def remove_vm(self, vm: Vm) -> None:
        vm.hypervisor.unplug(vm.tap)
        sh("ip", "netns", "del", vm.ns, check=False)
        if vm.ns in self.rec.netns:
            self.rec.netns.remove(vm.ns)
            self.rec.save()
        self.vms.pop(vm.name, None)

    def teardown(self) -> None:
        for hv in self.hypervisors.values():
            self.stop_agent(hv)
        self.rec.teardown()
