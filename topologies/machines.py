"""The emulated machines, one model for both fabrics: a hypervisor (its private Open vSwitch, its agent) and a VM
(its interface, how it is plugged, how it gets its address).

Two fabrics wire them: `hosts.Fabric` (plain namespaces and veths, for the agent's integration tests and the
benchmarks) and `cluster.Cluster` (Mininet, for the scenarios and the demo). Whatever happens *on* a machine
(starting OVS or the agent, plugging a VM the way Nova/OVN do, DHCP) is written once, here; the fabrics only make
the namespaces and links and record what they made. One
private ovsdb-server + ovs-vswitchd (userspace datapath) per hypervisor namespace.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from topologies import netns
from topologies.netns import sh
from vswitch_agent.ovsdb import Ovsdb

VM_MTU = "1450"  # the VPCs' MTU: the underlay's 1500 less the VXLAN encapsulation
AGENT_METRICS_PORT = 9465  # each agent's Prometheus metrics, on 127.0.0.1 in its hypervisor's namespace


def spawn(ns: str, cmd: list[str], log: Path, env: dict | None = None) -> int:
    """A long-running process in namespace `ns`, in its own session (stopped by its pid), output to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as f:
        p = netns.popen(*cmd, ns=ns, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return p.pid


def resolv_conf(lease_dir: Path, vm: str) -> Path:
    """A VM's resolv.conf, which its dhclient writes (made empty if absent)."""
    path = lease_dir / f"{vm}.resolv.conf"
    path.touch()
    return path


def own_resolv_conf(cmd: list[str], resolv: Path) -> list[str]:
    """`cmd` with /etc/resolv.conf bound to `resolv`: an emulated VM shares this machine's /etc, and dhclient-script
    writes the DHCP answer's DNS servers there. `ip netns exec` gives the command a mount namespace of its own (a
    slave of this one), so the bind stays with it and its children, dhclient's renewals included."""
    return ["sh", "-c", 'mount --bind "$0" /etc/resolv.conf && exec "$@"', str(resolv), *cmd]


def dhclient_pid(pidfile: Path, wait: float = 5.0) -> int | None:
    """The pid in a dhclient pid file. dhclient writes it after it daemonises, so it may exist and still be empty
    for a moment."""
    deadline = time.monotonic() + wait
    while not (text := pidfile.read_text().strip() if pidfile.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.05)
    return int(text) if text else None


def start_private_ovs(ns: str, rundir: Path, other_config: dict[str, str] | None = None,
                      vswitchd: str | None = None) -> list[int]:
    """A private ovsdb-server + ovs-vswitchd (userspace datapath) inside namespace `ns`, with its own run
    directory: one per emulated hypervisor (only one userspace ovs-vswitchd can run per namespace).
    `other_config` (Open_vSwitch's, before ovs-vswitchd starts) and `vswitchd` (another build): OVS-DPDK."""
    rundir.mkdir(parents=True, exist_ok=True)
    db = rundir / "conf.db"
    if not db.exists():
        sh("ovsdb-tool", "create", str(db), "/usr/share/openvswitch/vswitch.ovsschema")
    start_ovs_daemon("ovsdb-server", ns, rundir)
    sh("ovs-vsctl", f"--db=unix:{rundir}/db.sock", "--no-wait", "init", ns=ns, env=ovs_env(rundir))
    if other_config:
        sh("ovs-vsctl", f"--db=unix:{rundir}/db.sock", "--no-wait", "set", "Open_vSwitch", ".",
           *(f'other_config:{k}="{v}"' for k, v in other_config.items()), ns=ns, env=ovs_env(rundir))
    start_ovs_daemon("ovs-vswitchd", ns, rundir, vswitchd)
    return ovs_pids(rundir)


def start_ovs_daemon(which: str, ns: str, rundir: Path, binary: str | None = None) -> None:
    """ovsdb-server or ovs-vswitchd of a private OVS instance, detached, its pid in RUNDIR/WHICH.pid. `binary`:
    another build of it (Debian's DPDK ovs-vswitchd), run by a link named WHICH: OVS names its control socket
    after its argv[0], and `ovs-appctl -t WHICH` (the agent's live trace, the tests) looks for WHICH.PID.ctl."""
    first = [str(rundir / "conf.db"), f"--remote=punix:{rundir}/db.sock"] if which == "ovsdb-server" \
        else [f"unix:{rundir}/db.sock"]
    if binary:
        link = rundir / "bin" / which
        link.parent.mkdir(exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(binary)
        binary = str(link)
    sh(binary or which, *first, "--detach", "--no-chdir", f"--pidfile={rundir}/{which}.pid",
       f"--log-file={rundir}/{which}.log", "-vconsole:off", ns=ns, env=ovs_env(rundir))


def restart_ovs_daemon(which: str, ns: str, rundir: Path, sig: int = signal.SIGTERM,
                       binary: str | None = None) -> tuple[int | None, int]:
    """Stop one of a private OVS instance's daemons (by its pid file, with `sig`; SIGKILL if it is still there
    after 10 s) and start it again, perhaps as another build: (the old pid, the new)."""
    pidfile = rundir / f"{which}.pid"
    old = int(pidfile.read_text()) if pidfile.exists() else None
    if old is not None:
        try:
            os.kill(old, sig)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                os.kill(old, 0)
                time.sleep(0.02)
            os.kill(old, signal.SIGKILL)
        except ProcessLookupError:
            pass
    pidfile.unlink(missing_ok=True)
    start_ovs_daemon(which, ns, rundir, binary)
    return old, int(pidfile.read_text())


def ovs_env(rundir: Path) -> dict[str, str]:
    return os.environ | {"OVS_RUNDIR": str(rundir), "OVS_LOGDIR": str(rundir), "OVS_DBDIR": str(rundir)}


def ovs_pids(rundir: Path) -> list[int]:
    return [int((rundir / p).read_text()) for p in ("ovsdb-server.pid", "ovs-vswitchd.pid") if (rundir / p).exists()]


@dataclass
class Hypervisor:
    """A hypervisor: namespace `ns` with the underlay on ul0 and its own OVS (run directory `rundir`)."""

    name: str
    ns: str
    rundir: Path
    vtep: str  # the VTEP address with its prefix, e.g. 172.31.0.11/24 (the agent puts it on br-phy)
    controller_ip: str  # the controller's address as seen from this namespace
    agent_pid: int | None = None
    of_port: int | None = None  # the agent's OpenFlow listener, if not the default

    def start_ovs(self) -> list[int]:
        return start_private_ovs(self.ns, self.rundir)

    def agent_command(self, tianji: str, controller_url: str, token: str, state_dir: Path,
                      underlay_if: str = "ul0", tls: list[str] | tuple[str, ...] = ()) -> list[str]:
        """`tls`: --ca, --cert and --key (the emulated cluster's); none where the controller serves plain HTTP."""
        cmd = [tianji, "agent", "--host", self.name, "--controller", controller_url, "--token", token,
               "--vtep-ip", self.vtep, "--underlay-if", underlay_if, "--ovs-rundir", str(self.rundir),
               "--state-dir", str(state_dir), "--metrics-port", str(AGENT_METRICS_PORT), *tls]
        return cmd + (["--of-port", str(self.of_port)] if self.of_port is not None else [])

    def start_agent(self, tianji: str, controller_url: str, token: str, state_dir: Path, log: Path,
                    tls: list[str] | tuple[str, ...] = ()) -> int:
        self.agent_pid = spawn(self.ns, self.agent_command(tianji, controller_url, token, state_dir, tls=tls), log)
        return self.agent_pid

    def vsctl(self, *args: str) -> str:
        return sh("ovs-vsctl", f"--db=unix:{self.rundir}/db.sock", *args, ns=self.ns).stdout

    def ofctl(self, *args: str) -> str:
        return sh("ovs-ofctl", "-O", "OpenFlow13", *args, ns=self.ns,
                  env=os.environ | {"OVS_RUNDIR": str(self.rundir)}).stdout

    @property
    def ovsdb(self) -> Ovsdb:
        return Ovsdb(str(self.rundir))

    def plug(self, tap: str, port_id: str, mac: str, port_type: str = "system") -> str:
        """Plug into br-int as Nova/OVN do (vswitch_agent.ovsdb.Ovsdb.plug): the port type used."""
        return self.ovsdb.plug("br-int", tap, port_id, mac, port_type)

    def unplug(self, tap: str) -> None:
        self.ovsdb.unplug("br-int", tap)

    def wait_port_flows(self, mac: str, timeout: float = 10) -> bool:
        """Whether the agent put a port's port-security flows in within `timeout` (DHCP needs them)."""
        deadline = time.time() + timeout
        while f"dl_src={mac}" not in self.ofctl("dump-flows", "br-int", "table=10"):
            if time.time() > deadline:
                return False
            time.sleep(0.02)
        return True

    def against_computed(self, config: dict, zones_file: Path) -> tuple[set[int], set[int], dict[str, int]]:
        """(cookies computed from scratch, cookies on the switch, plugged ports): the flows `compute_flows` gives
        for the controller's config (`config`: its JSON) and the switch's interfaces, which the incremental agent
        must have arrived at, next to what br-int holds."""
        from tianji.southbound import HostConfig
        from vswitch_agent.flows import compute_flows

        ofports, tunnel = Ovsdb(str(self.rundir)).interfaces()
        zones = json.loads(zones_file.read_text())
        want = {f.cookie for f in compute_flows(HostConfig.model_validate(config), ofports, tunnel, zones)}
        have = {int(c, 16) for c in re.findall(r"cookie=(0x[0-9a-f]+)", self.ofctl("dump-flows", "br-int",
                                                                                   "--no-stats"))}
        return want, have, ofports


@dataclass
class GatewayHost:
    """A gateway host: namespace `ns` with the underlay on ul0 (its VTEP `vtep`, with prefix) and the external
    segment on ext0 (role private-line: the customers' handoff on ho0); it runs one gateway instance of a role
    (`tianji gateway run --role`)."""

    name: str
    ns: str
    vtep: str
    role: str = "nat"

    def command(self, tianji: str, source: list[str], state_dir: Path, *extra: str) -> list[str]:
        """The instance's command line; `source`: where its config comes from (--controller URL --token T, or
        --config-file F)."""
        side = ["--handoff-if", "ho0"] if self.role == "private-line" else \
            ["--external-if", "ext0"]
        return [tianji, "gateway", "run", "--role", self.role, "--name", self.name, "--underlay-if", "ul0",
                "--vtep-ip", self.vtep, *side, *source, "--state-dir", str(state_dir), *extra]

    def start(self, tianji: str, source: list[str], state_dir: Path, log: Path, *extra: str) -> int:
        return spawn(self.ns, self.command(tianji, source, state_dir, *extra), log)


@dataclass
class Vm:
    """A VM: namespace `ns` whose eth0 is one end of a veth; the other end, `tap`, is on its hypervisor."""

    name: str
    ns: str
    hypervisor: Hypervisor
    port_id: str
    tap: str
    mac: str
    ip: str | None = None

    def configure(self, mtu: int = int(VM_MTU), tap_mtu: int | None = None) -> None:
        """eth0 with the port's MAC and the VPC's MTU, TX checksum offload off (the userspace datapath cannot
        complete a veth's partial checksums); the tap up on the hypervisor, at the largest MTU a VPC may have
        there (`tap_mtu`, the underlay's less 50: before it is plugged, as AF_XDP ports need)."""
        self.exec("ip", "link", "set", "eth0", "address", self.mac)
        self.exec("ip", "link", "set", "eth0", "mtu", str(mtu), "up")
        self.exec("ethtool", "-K", "eth0", "tx", "off")
        sh("ip", "link", "set", self.tap, "mtu", str(tap_mtu or mtu), "up", ns=self.hypervisor.ns)

    def plug(self, port_id: str, port_type: str = "system") -> str:
        self.port_id = port_id
        return self.hypervisor.plug(self.tap, port_id, self.mac, port_type)

    def dhcp(self, lease_dir: Path) -> int | None:
        """Address eth0 by DHCP (answered by the agent); the dhclient's pid, to be stopped with the fabric. The
        DNS servers of the answer go to the VM's own resolv.conf (`resolv_conf`), never this machine's."""
        pidfile = lease_dir / f"{self.name}.dhclient.pid"
        self.exec(*own_resolv_conf(["dhclient", "-1", "-4", "-lf", str(lease_dir / f"{self.name}.leases"), "-pf",
                                    str(pidfile), "eth0"], resolv_conf(lease_dir, self.name)), timeout=30)
        return dhclient_pid(pidfile)

    def static(self, ip: str, prefixlen: int, gateway: str) -> None:
        self.exec("ip", "addr", "add", f"{ip}/{prefixlen}", "dev", "eth0")
        self.exec("ip", "route", "add", "default", "via", gateway)
        self.ip = ip

    def exec(self, *cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        return sh(*cmd, ns=self.ns, check=check, timeout=timeout)

    def popen(self, *cmd: str, **kw) -> subprocess.Popen:
        return netns.popen(*cmd, ns=self.ns, **kw)


__all__ = ["GatewayHost", "Hypervisor", "Vm", "dhclient_pid", "own_resolv_conf", "resolv_conf", "ovs_env",
           "ovs_pids", "restart_ovs_daemon", "sh", "spawn", "start_ovs_daemon", "start_private_ovs"]
