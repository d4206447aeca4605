"""Hypervisors and VMs as network namespaces, built the way ../shared/recipes/vxlan_ovs_ns.sh does it:
one private ovsdb-server + ovs-vswitchd (userspace datapath) per hypervisor namespace.

Everything made is recorded in a state file, so `teardown()` (or a later run after a crash) removes exactly
what was created and nothing else. Processes are stopped by PID, never by name.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

VENV_BIN = Path(sys.executable).parent


def sh(*cmd: str, check: bool = True, ns: str | None = None, env: dict | None = None,
       timeout: float = 30) -> subprocess.CompletedProcess:
    full = (["ip", "netns", "exec", ns] if ns else []) + list(cmd)
    r = subprocess.run(full, capture_output=True, text=True, env=env, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(full)} failed: {r.stderr.strip() or r.stdout.strip()}")
    return r


def dhclient_pid(pidfile: Path, wait: float = 5.0) -> int | None:
    """The pid in a dhclient pid file. dhclient writes it after it daemonises, so it may exist and still be empty
    for a moment (read too early, the harness once failed on an empty string)."""
    deadline = time.monotonic() + wait
    while not (text := pidfile.read_text().strip() if pidfile.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.05)
    return int(text) if text else None


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


def start_private_ovs(ns: str, rundir: Path) -> list[int]:
    """A private ovsdb-server + ovs-vswitchd (userspace datapath) inside namespace `ns`, with its own run
    directory: one per emulated hypervisor (only one userspace ovs-vswitchd can run per namespace)."""
    rundir.mkdir(parents=True, exist_ok=True)
    db = rundir / "conf.db"
    if not db.exists():
        sh("ovsdb-tool", "create", str(db), "/usr/share/openvswitch/vswitch.ovsschema")
    start_ovs_daemon("ovsdb-server", ns, rundir)
    sh("ovs-vsctl", f"--db=unix:{rundir}/db.sock", "--no-wait", "init", ns=ns, env=ovs_env(rundir))
    start_ovs_daemon("ovs-vswitchd", ns, rundir)
    return ovs_pids(rundir)


def start_ovs_daemon(which: str, ns: str, rundir: Path) -> None:
    """ovsdb-server or ovs-vswitchd of a private OVS instance, detached, its pid in RUNDIR/WHICH.pid."""
    first = [str(rundir / "conf.db"), f"--remote=punix:{rundir}/db.sock"] if which == "ovsdb-server" \
        else [f"unix:{rundir}/db.sock"]
    sh(which, *first, "--detach", "--no-chdir", f"--pidfile={rundir}/{which}.pid", f"--log-file={rundir}/{which}.log",
       "-vconsole:off", ns=ns, env=ovs_env(rundir))


def ovs_env(rundir: Path) -> dict[str, str]:
    return os.environ | {"OVS_RUNDIR": str(rundir), "OVS_LOGDIR": str(rundir), "OVS_DBDIR": str(rundir)}


def ovs_pids(rundir: Path) -> list[int]:
    return [int((rundir / p).read_text()) for p in ("ovsdb-server.pid", "ovs-vswitchd.pid") if (rundir / p).exists()]


def wait_gone(pid: int, deadline: float) -> bool:
    """Wait until process `pid` has exited or `deadline` (time.time()) has passed; whether it is gone."""
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


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


@dataclass
class Hypervisor:
    name: str
    index: int
    ns: str
    rundir: Path
    vtep: ipaddress.IPv4Interface
    mgmt_ip: str  # the controller's address as seen from this namespace
    agent_pid: int | None = None
    of_port: int = 6653

    def vsctl(self, *args: str) -> str:
        return sh("ovs-vsctl", f"--db=unix:{self.rundir}/db.sock", *args, ns=self.ns).stdout

    def ofctl(self, *args: str) -> str:
        return sh("ovs-ofctl", "-O", "OpenFlow13", *args, ns=self.ns,
                  env=os.environ | {"OVS_RUNDIR": str(self.rundir)}).stdout

    def against_computed(self, config: dict, zones_file: Path) -> tuple[set[int], set[int], dict[str, int]]:
        """(cookies computed from scratch, cookies on the switch, plugged ports): the flows `compute_flows` gives
        for the controller's config (`config`: its JSON) and the switch's interfaces, which the incremental agent
        must have arrived at, next to what br-int holds."""
        from tianji.southbound import HostConfig
        from vswitch_agent.flows import compute_flows
        from vswitch_agent.ovsdb import Ovsdb

        ofports, tunnel = Ovsdb(str(self.rundir)).interfaces()
        zones = json.loads(zones_file.read_text())
        want = {f.cookie for f in compute_flows(HostConfig.model_validate(config), ofports, tunnel, zones)}
        have = {int(c, 16) for c in re.findall(r"cookie=(0x[0-9a-f]+)", self.ofctl("dump-flows", "br-int",
                                                                                   "--no-stats"))}
        return want, have, ofports


@dataclass
class Vm:
    name: str
    ns: str
    hypervisor: Hypervisor
    port_id: str
    tap: str
    mac: str
    ip: str | None = None

    def exec(self, *cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        return sh(*cmd, ns=self.ns, check=check, timeout=timeout)

    def popen(self, *cmd: str, **kw) -> subprocess.Popen:
        return subprocess.Popen(["ip", "netns", "exec", self.ns, *cmd], **kw)


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
        sh("ip", "netns", "add", name)
        self.rec.netns.append(name)
        self.rec.save()
        sh("ip", "link", "set", "lo", "up", ns=name)
        return name

    def _spawn(self, ns: str, cmd: list[str], log: Path, env: dict | None = None) -> int:
        with open(log, "ab") as f:
            p = subprocess.Popen(["ip", "netns", "exec", ns, *cmd], stdout=f, stderr=subprocess.STDOUT,
                                 env=env, start_new_session=True)
        self.rec.pids.append(p.pid)
        self.rec.save()
        return p.pid

    def add_hypervisor(self, name: str) -> Hypervisor:
        i = len(self.hypervisors) + 1
        ns = self._ns(f"tj{self.tag}h{i}")
        rundir = self.base / name
        rundir.mkdir(parents=True, exist_ok=True)
        try:
            start_private_ovs(ns, rundir)
        finally:  # whatever started is recorded, so teardown stops it even if a later step failed
            for pid in ovs_pids(rundir):
                if pid not in self.rec.pids:
                    self.rec.pids.insert(0, pid)
            self.rec.save()
        # underlay: a veth into the bridge namespace; the VTEP IP goes on br-phy (the agent puts it there)
        sh("ip", "link", "add", "ul0", "netns", ns, "type", "veth", "peer", "name", f"ul-{i}", "netns", self.ul_ns)
        sh("ip", "link", "set", f"ul-{i}", "master", "br0", "up", ns=self.ul_ns)
        sh("ip", "link", "set", "ul0", "up", ns=ns)
        # management: a point-to-point veth to the root namespace, where the controller listens
        root_if = f"tj{self.tag}m{i}"
        base_ip = ipaddress.IPv4Address("169.254.100.0") + 4 * i
        sh("ip", "link", "add", root_if, "type", "veth", "peer", "name", "mgmt0", "netns", ns)
        self.rec.links.append(root_if)
        self.rec.save()
        sh("ip", "addr", "add", f"{base_ip + 1}/30", "dev", root_if)
        sh("ip", "link", "set", root_if, "up")
        sh("ip", "addr", "add", f"{base_ip + 2}/30", "dev", "mgmt0", ns=ns)
        sh("ip", "link", "set", "mgmt0", "up", ns=ns)
        hv = Hypervisor(name, i, ns, rundir, ipaddress.IPv4Interface(f"172.31.0.{i}/24"), str(base_ip + 1))
        self.hypervisors[name] = hv
        return hv

    def start_agent(self, hv: Hypervisor, controller_port: int, token: str) -> int:
        cmd = [str(VENV_BIN / "tianji"), "agent", "--host", hv.name,
               "--controller", f"http://{hv.mgmt_ip}:{controller_port}", "--token", token,
               "--vtep-ip", str(hv.vtep), "--underlay-if", "ul0", "--ovs-rundir", str(hv.rundir),
               "--of-port", str(hv.of_port), "--state-dir", str(self.base / "agents")]
        hv.agent_pid = self._spawn(hv.ns, cmd, self.base / f"agent-{hv.name}.log")
        return hv.agent_pid

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
        pidfile = hv.rundir / f"{which}.pid"
        old = int(pidfile.read_text())
        try:
            os.kill(old, sig)
        except ProcessLookupError:
            pass
        wait_gone(old, time.time() + 5)
        pidfile.unlink(missing_ok=True)
        start_ovs_daemon(which, hv.ns, hv.rundir)
        new = int(pidfile.read_text())
        self.rec.pids = [new if p == old else p for p in self.rec.pids]
        self.rec.save()

    def agent_status(self, hv: Hypervisor) -> dict:
        return read_status(self.base / "agents" / f"agent-{hv.name}.json")

    def prepare_vm(self, name: str, hv: Hypervisor, mac: str) -> Vm:
        """The VM's namespace and veth (MTU 1450, TX offload off), not yet plugged into br-int."""
        ns = self._ns(f"tj{self.tag}{name}"[:15])
        tap = f"t{self.tag}{name}"[:15]
        sh("ip", "link", "add", "eth0", "netns", ns, "address", mac, "type", "veth", "peer", "name", tap,
           "netns", hv.ns)
        sh("ip", "link", "set", "eth0", "mtu", "1450", "up", ns=ns)
        sh("ethtool", "-K", "eth0", "tx", "off", ns=ns)
        sh("ip", "link", "set", tap, "mtu", "1450", "up", ns=hv.ns)
        vm = Vm(name, ns, hv, "", tap, mac)
        self.vms[name] = vm
        return vm

    def plug_vm(self, vm: Vm, port: dict, dhcp: bool = False) -> Vm:
        """Plug the way Nova/OVN do (iface-id names the port), then address it: statically or by DHCP."""
        vm.port_id = port["id"]
        vm.hypervisor.vsctl("--may-exist", "add-port", "br-int", vm.tap, "--", "set", "interface", vm.tap,
                            f"external_ids:iface-id={port['id']}", f"external_ids:attached-mac={port['mac']}")
        if dhcp:
            pf = self.base / f"{vm.name}.dhclient.pid"
            sh("dhclient", "-1", "-4", "-lf", str(self.base / f"{vm.name}.leases"), "-pf", str(pf), "eth0",
               ns=vm.ns, timeout=30)
            if (pid := dhclient_pid(pf)) is not None:
                self.rec.pids.append(pid)
                self.rec.save()
        else:
            sh("ip", "addr", "add", f"{port['ip']}/{port.get('prefixlen', 24)}", "dev", "eth0", ns=vm.ns)
            sh("ip", "route", "add", "default", "via", port["gateway_ip"], ns=vm.ns)
        vm.ip = port["ip"]
        return vm

    def add_vm(self, name: str, hv: Hypervisor, port: dict, dhcp: bool = False) -> Vm:
        """A VM for `port` on `hv`: prepared and plugged."""
        return self.plug_vm(self.prepare_vm(name, hv, port["mac"]), port, dhcp)

    def remove_vm(self, vm: Vm) -> None:
        vm.hypervisor.vsctl("--if-exists", "del-port", "br-int", vm.tap)
        sh("ip", "netns", "del", vm.ns, check=False)
        if vm.ns in self.rec.netns:
            self.rec.netns.remove(vm.ns)
            self.rec.save()
        self.vms.pop(vm.name, None)

    def teardown(self) -> None:
        for hv in self.hypervisors.values():
            self.stop_agent(hv)
        self.rec.teardown()
