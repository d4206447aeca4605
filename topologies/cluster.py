"""The emulated cluster: bring it up from a topology file, add VMs, tear down exactly what was made.

State lives in `<state_dir>/state.json`, written as things are created, so `down` also works after a crash.
Processes are stopped by PID, namespaces and links deleted by name; nothing else on the machine is touched.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from controller.client import ApiFailure, Client
from tianji.statusfile import write_atomic
from topologies.hosts import read_status
from topologies.machines import Hypervisor, Vm

TOPOLOGIES = Path(__file__).parent / "data"
TIANJI = str(Path(sys.executable).parent / "tianji")
MGMT_NET = ipaddress.IPv4Network("169.254.250.0/24")
def controller_env() -> dict[str, str]:
    """NAT instances fail over fast here: five beats (TIANJI_GATEWAY_BEAT, 0.1 s) of silence (overridable)."""
    return os.environ | {"TIANJI_GATEWAY_DOWN_AFTER": os.environ.get("TIANJI_GATEWAY_DOWN_AFTER", "0.5")}
EIP_POOL = "203.0.113.0/24"  # the operator's public addresses in the emulation (RFC 5737 TEST-NET-3)
DEFAULT_STATE = Path("/run/tianji-cluster")
_SAVE_LOCK = threading.Lock()


def load_topology(name_or_path: str) -> dict:
    p = Path(name_or_path)
    if not p.exists():
        p = TOPOLOGIES / f"{name_or_path}.json"
    if not p.exists():
        known = ", ".join(sorted(x.stem for x in TOPOLOGIES.glob("*.json")))
        raise SystemExit(f"unknown topology {name_or_path!r}: use one of {known}, or a path to a JSON file")
    topo = json.loads(p.read_text())
    for key in ("hypervisors",):
        if not topo.get(key):
            raise SystemExit(f"topology {p}: '{key}' must list at least one node")
    return topo


@dataclass
class State:
    name: str
    dir: str
    topology: dict = field(default_factory=dict)
    controller_url: str = ""
    controller_port: int = 0
    admin_token: str = ""
    host_tokens: dict[str, str] = field(default_factory=dict)  # one credential per host, bound to it
    orchestrator_token: str = ""  # binds ports to hypervisors, as Nova or a CNI plugin would
    netns: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)  # root-namespace bridges and interfaces
    pids: list[int] = field(default_factory=list)
    hypervisors: dict[str, dict] = field(default_factory=dict)
    vms: dict[str, dict] = field(default_factory=dict)
    nodes: dict[str, dict] = field(default_factory=dict)
    up_seconds: float | None = None

    @property
    def path(self) -> Path:
        return Path(self.dir) / "state.json"

    def save(self) -> None:
        with _SAVE_LOCK:  # VMs may be plugged from several threads
            write_atomic(self.path, json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, state_dir: Path) -> State:
        p = state_dir / "state.json"
        if not p.exists():
            raise SystemExit(f"no cluster state at {p}: bring one up with `tianji cluster up`")
        return cls(**json.loads(p.read_text()))


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return r


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, state: State) -> None:
        self.state = state
        self.net = None  # the Mininet object, only in the process that ran `up`

    # --- bring-up ------------------------------------------------------------------------------------------
    @classmethod
    def up(cls, topology: str = "small", *, name: str = "tj", state_dir: Path = DEFAULT_STATE,
           database_url: str | None = None, progress=print) -> Cluster:
        from mininet.link import Link
        from mininet.log import setLogLevel
        from mininet.net import Mininet

        from topologies.hosts import check_prerequisites
        from topologies.nodes import ExternalNode, GatewayNode, HypervisorNode, OnPremNode, Segment

        check_prerequisites()
        setLogLevel("warning")
        t0 = time.monotonic()
        topo = load_topology(topology)
        sdir = state_dir / name
        if (sdir / "state.json").exists():
            raise SystemExit(f"a cluster named {name!r} is already up (state in {sdir}); "
                             f"`tianji cluster down --name {name}` first")
        if sdir.exists():
            shutil.rmtree(sdir)
        st = State(name=name, dir=str(sdir), topology=topo)
        st.save()
        c = cls(st)
        try:
            # the controller, on SQLite in the cluster's state directory unless a database URL is given
            port = _free_port()
            cdir = sdir / "controller"
            cmd = [TIANJI, "controller", "serve", "--host", "0.0.0.0", "--port", str(port), "--state-dir",
                   str(cdir), "--host-down-after", "6", "--log-level", "warning"]
            if database_url:
                cmd += ["--database-url", database_url]
            cdir.mkdir(parents=True, exist_ok=True)
            with open(sdir / "controller.log", "ab") as log:
                p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env=controller_env())
            st.pids.append(p.pid)
            st.controller_port, st.controller_url = port, f"http://127.0.0.1:{port}"
            st.save()
            progress(f"controller started (pid {p.pid}) on port {port}")

            net = Mininet(topo=None, build=False, controller=None, switch=Segment, cleanup=False,
                          autoSetMacs=False, link=Link)
            c.net = net
            ul = net.addSwitch(f"{name}-ul", cls=Segment)
            mg = net.addSwitch(f"{name}-mg", cls=Segment)
            ex = net.addSwitch(f"{name}-ex", cls=Segment)
            st.links += [ul.name, mg.name, ex.name]
            st.save()
            hvs = {}
            underlay = ipaddress.IPv4Network(topo.get("underlay", "172.31.0.0/24"))
            for i, hv_name in enumerate(topo["hypervisors"], start=1):
                ns = f"{name}-{hv_name}"
                st.netns.append(ns)
                st.save()
                hv = net.addHost(hv_name, cls=HypervisorNode, nsname=ns, ip=None)
                net.addLink(hv, ul, intfName1="ul0", intfName2=f"{name}{hv_name}u"[:15])
                net.addLink(hv, mg, intfName1="mgmt0", intfName2=f"{name}{hv_name}m"[:15])
                mgmt_ip = MGMT_NET.network_address + 10 + i
                hv.run("ip", "addr", "add", f"{mgmt_ip}/{MGMT_NET.prefixlen}", "dev", "mgmt0")
                hv.run("ip", "link", "set", "mgmt0", "up")
                hv.run("ip", "link", "set", "ul0", "up")
                hvs[hv_name] = hv
                st.hypervisors[hv_name] = {"ns": ns, "rundir": str(sdir / hv_name),
                                           "vtep": f"{underlay.network_address + 10 + i}/{underlay.prefixlen}",
                                           "controller_ip": str(MGMT_NET.network_address + 1), "agent_pid": None}
            for role, cls_, names in (("gateway", GatewayNode, topo.get("gateways", [])),
                                      ("external", ExternalNode, topo.get("external", [])),
                                      ("onprem", OnPremNode, topo.get("onprem", []))):
                for j, n in enumerate(names, start=1):
                    ns = f"{name}-{n}"
                    st.netns.append(ns)
                    node = net.addHost(n, cls=cls_, nsname=ns, ip=None)
                    info: dict = {"ns": ns, "role": role}
                    if role == "gateway":
                        net.addLink(node, ul, intfName1="ul0", intfName2=f"{name}{n}u"[:15])
                        net.addLink(node, ex, intfName1="ext0", intfName2=f"{name}{n}x"[:15])
                        net.addLink(node, mg, intfName1="mgmt0", intfName2=f"{name}{n}m"[:15])
                        addr = f"{underlay.network_address + 100 + j}/{underlay.prefixlen}"
                        node.run("ip", "addr", "add", addr, "dev", "ul0")
                        mgmt_ip = MGMT_NET.network_address + 100 + j
                        node.run("ip", "addr", "add", f"{mgmt_ip}/{MGMT_NET.prefixlen}", "dev", "mgmt0")
                        # full checksums on the wire: the hypervisors' userspace datapath (and the gateway's own
                        # packet socket) cannot complete a veth's offloaded partial checksum
                        node.run("ethtool", "-K", "ul0", "tx", "off")
                        info["underlay_ip"] = addr
                    elif role == "onprem" and topo.get("gateways"):
                        gw = net.get(topo["gateways"][0])  # the private line ends on the first gateway host
                        net.addLink(node, gw, intfName1="pl0", intfName2=f"pl-{n}"[:15])
                    elif role == "external":
                        net.addLink(node, ex, intfName1="eth0", intfName2=f"{name}{n}x"[:15])
                        node.run("ip", "addr", "add", f"198.51.100.{j}/24", "dev", "eth0")
                        node.run("ip", "link", "set", "eth0", "up")
                        node.run("ethtool", "-K", "eth0", "tx", "off")  # full checksums (see the gateway's ul0)
                        node.run("ip", "route", "add", EIP_POOL, "dev", "eth0")  # the EIPs are on this segment
                        info["ip"] = f"198.51.100.{j}"
                    for intf in node.intfList():
                        node.run("ip", "link", "set", intf.name, "up", check=False)
                    st.nodes[n] = info
                    st.save()
            net.build()
            for sw in (ul, mg, ex):
                sw.start([])
            _sh("ip", "addr", "add", f"{MGMT_NET.network_address + 1}/{MGMT_NET.prefixlen}", "dev", mg.name)
            progress(f"Mininet: {len(hvs)} hypervisors, {len(st.nodes)} other nodes, underlay {underlay}")

            # OVS and agents on every hypervisor, then wait until every agent has reported in
            admin = c._admin(wait=True)
            st.admin_token = admin.http.headers["Authorization"].split()[1]
            st.orchestrator_token = admin.post("/v1/orchestrator-tokens", {"name": "orchestrator"})["token"]
            for hv_name in hvs:
                st.host_tokens[hv_name] = admin.post("/v1/host-tokens", {"host": hv_name})["token"]
            for n, i in st.nodes.items():
                if i["role"] == "gateway":
                    st.host_tokens[n] = admin.post("/v1/host-tokens", {"host": n, "kind": "gateway"})["token"]
            st.save()
            for hv_name in hvs:
                st.pids += c.hypervisor(hv_name).start_ovs()
                st.save()
                c.start_agent(hv_name)
            progress("agents started; waiting for every agent to report in ...")
            c.wait_agents(timeout=60)
            gateways = [n for n, i in st.nodes.items() if i["role"] == "gateway"]
            if gateways:
                admin.post("/v1/eip-pools", {"cidr": EIP_POOL})
                for n in gateways:
                    c.start_gateway(n)
                c.wait_gateways(timeout=30)
                progress(f"NAT gateway instances up: {', '.join(gateways)}; EIP pool {EIP_POOL}")
            st.up_seconds = round(time.monotonic() - t0, 2)
            st.save()
            progress(f"cluster {name!r} up in {st.up_seconds} s")
            return c
        except BaseException:
            c.down()
            raise

    def _admin(self, wait: bool = False) -> Client:
        token_file = Path(self.state.dir) / "controller" / "admin.token"
        deadline = time.time() + 20
        while True:
            try:
                c = Client(self.state.controller_url, token_file.read_text().strip())
                c.get("/healthz")
                return c
            except (OSError, ApiFailure):
                if not wait or time.time() > deadline:
                    raise SystemExit("the cluster's controller is not answering; see "
                                     f"{self.state.dir}/controller.log") from None
                time.sleep(0.1)

    @property
    def admin(self) -> Client:
        return Client(self.state.controller_url, self.state.admin_token)

    @property
    def orchestrator(self) -> Client:
        """Binds ports to hypervisors (`PATCH /v1/ports/{id} {"host": ...}`), as Nova or a CNI plugin would."""
        return Client(self.state.controller_url, self.state.orchestrator_token)

    def agent_status(self, hv: str) -> dict:
        return read_status(Path(self.state.dir) / "agents" / f"agent-{hv}.json")

    def wait_agents(self, timeout: float = 30) -> None:
        deadline = time.time() + timeout
        want = set(self.state.hypervisors)
        while True:
            up = {h["name"] for h in self.admin.get("/v1/hosts") if h["status"] == "up"}
            ready = {h for h in want if self.agent_status(h).get("switch_connected")}
            if want <= up and want <= ready:
                return
            if time.time() > deadline:
                raise SystemExit(f"agents not ready after {timeout}s: {sorted(want - (up & ready))}; "
                                 f"see {self.state.dir}/agent-*.log")
            time.sleep(0.1)

    def wait_converged(self, timeout: float = 15) -> None:
        deadline = time.time() + timeout
        for hv in self.state.hypervisors:
            want = self.admin.get(f"/v1/hosts/{hv}/config")["revision"]
            while (self.agent_status(hv).get("revision") or -1) < want:
                if time.time() > deadline:
                    raise TimeoutError(f"agent {hv} did not converge to revision {want}")
                time.sleep(0.02)

    # --- nodes ---------------------------------------------------------------------------------------------
    def hypervisor(self, name: str) -> Hypervisor:
        info = self.state.hypervisors[name]
        return Hypervisor(name, info["ns"], Path(info["rundir"]), info["vtep"], info["controller_ip"],
                          info["agent_pid"])

    def vm_add(self, port_id: str, name: str | None = None, dhcp: bool = True) -> dict:
        """Plug a VM for a port on the port's host (the way Nova/OVN plug: veth + iface-id)."""
        from mininet.link import Link

        from topologies.nodes import HypervisorNode, VmNode

        st = self.state
        port = self.admin.get(f"/v1/ports/{port_id}")
        if not port.get("host"):
            raise SystemExit(f"port {port_id} is not bound to a host: `tianji port bind {port_id} HOST` first")
        if port["host"] not in st.hypervisors:
            raise SystemExit(f"port {port_id} is bound to {port['host']}, which is not in this cluster")
        subnet = self.admin.get(f"/v1/subnets/{port['subnet_id']}")
        name = name or f"vm{port_id[:6]}"
        if name in st.vms:
            raise SystemExit(f"a VM named {name} exists already")
        ns = f"{st.name}-{name}"
        st.netns.append(ns)
        st.save()
        hv = self.hypervisor(port["host"])
        vm = Vm(name, ns, hv, port_id, f"tp{port_id[:8]}", port["mac"])
        vm_node, hv_node = VmNode(name, nsname=ns), HypervisorNode(hv.name, nsname=hv.ns)
        Link(vm_node, hv_node, intfName1="eth0", intfName2=vm.tap)
        vm_node.terminate()  # the shells are no longer needed; the named namespaces and their link stay
        hv_node.terminate()
        vm.configure()
        vm.plug(port_id)
        prefix = ipaddress.IPv4Network(subnet["cidr"]).prefixlen
        # DHCP is answered by the switch: wait until the agent has put this port's flows in, so the client's
        # first DISCOVER is answered instead of waiting seconds for its retransmission
        if not hv.wait_port_flows(port["mac"]):
            raise SystemExit(f"the agent on {port['host']} did not program port {port_id} within 10 s; "
                             f"see {st.dir}/agent-{port['host']}.log")
        if dhcp:
            if (pid := vm.dhcp(Path(st.dir))) is not None:
                st.pids.append(pid)
        else:
            vm.static(port["ip"], prefix, subnet["gateway_ip"])
        info = {"name": name, "ns": ns, "port_id": port_id, "host": port["host"], "tap": vm.tap, "ip": port["ip"],
                "mac": port["mac"], "prefixlen": prefix, "gateway": subnet["gateway_ip"]}
        st.vms[name] = info
        st.save()
        return info

    def vm_remove(self, name: str) -> None:
        st = self.state
        info = st.vms.pop(name)
        self.hypervisor(info["host"]).unplug(info["tap"])
        _sh("ip", "netns", "del", info["ns"], check=False)
        if info["ns"] in st.netns:
            st.netns.remove(info["ns"])
        st.save()

    def vm_exec(self, name: str, *cmd: str, check: bool = False, timeout: float = 30) -> subprocess.CompletedProcess:
        ns = self.state.vms[name]["ns"] if name in self.state.vms else f"{self.state.name}-{name}"
        r = subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True, timeout=timeout)
        if check and r.returncode:
            raise RuntimeError(f"{name}: {' '.join(cmd)}: {r.stderr.strip()}")
        return r

    # --- gateways ------------------------------------------------------------------------------------------
    def start_gateway(self, name: str) -> int:
        st = self.state
        info = st.nodes[name]
        cmd = ["ip", "netns", "exec", info["ns"], TIANJI, "gateway", "run", "--role", "nat", "--name", name,
               "--controller", f"http://{MGMT_NET.network_address + 1}:{st.controller_port}", "--token",
               st.host_tokens[name], "--underlay-if", "ul0", "--vtep-ip", info["underlay_ip"], "--external-if", "ext0",
               "--state-dir", str(Path(st.dir) / "gateways"), "--beat-interval",
               os.environ.get("TIANJI_GATEWAY_BEAT", "0.1")]
        with open(Path(st.dir) / f"gateway-{name}.log", "ab") as log:
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        info["pid"] = p.pid
        st.pids.append(p.pid)
        st.save()
        return p.pid

    def kill_gateway(self, name: str) -> None:
        pid = self.state.nodes[name]["pid"]
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        while _alive(pid):
            time.sleep(0.02)
        (Path(self.state.dir) / "gateways" / f"gateway-{name}.json").unlink(missing_ok=True)

    def gateway_status(self, name: str) -> dict:
        return read_status(Path(self.state.dir) / "gateways" / f"gateway-{name}.json")

    def wait_gateways(self, timeout: float = 30) -> None:
        want = {n for n, i in self.state.nodes.items() if i["role"] == "gateway"}
        deadline = time.time() + timeout
        while True:
            up = {h["name"] for h in self.admin.get("/v1/hosts") if h["kind"] == "gateway" and h["status"] == "up"}
            if want <= up and all(self.gateway_status(n).get("revision") is not None for n in want):
                return
            if time.time() > deadline:
                raise SystemExit(f"gateways not ready after {timeout}s; see {self.state.dir}/gateway-*.log")
            time.sleep(0.1)

    # --- faults --------------------------------------------------------------------------------------------
    def kill_agent(self, hv: str, sig: int = signal.SIGKILL) -> None:
        pid = self.state.hypervisors[hv]["agent_pid"]
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass
        while _alive(pid):
            time.sleep(0.02)

    def start_agent(self, hv: str) -> int:
        st = self.state
        info = st.hypervisors[hv]
        url = f"http://{info['controller_ip']}:{st.controller_port}"
        pid = self.hypervisor(hv).start_agent(TIANJI, url, st.host_tokens[hv], Path(st.dir) / "agents",
                                              Path(st.dir) / f"agent-{hv}.log")
        info["agent_pid"] = pid
        st.pids.append(pid)
        st.save()
        return pid

    def restart_controller(self, down_for: float = 1.0) -> None:
        """Stop the controller process and start it again on the same port and state."""
        st = self.state
        pid = st.pids[0]
        os.killpg(pid, signal.SIGTERM)
        while _alive(pid):
            time.sleep(0.02)
        time.sleep(down_for)
        cmd = [TIANJI, "controller", "serve", "--host", "0.0.0.0", "--port", str(st.controller_port), "--state-dir",
               str(Path(st.dir) / "controller"), "--host-down-after", "6", "--log-level", "warning"]
        with open(Path(st.dir) / "controller.log", "ab") as log:
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                 env=controller_env())
        st.pids[0] = p.pid
        st.save()
        self._admin(wait=True)

    # --- teardown ------------------------------------------------------------------------------------------
    def down(self) -> None:
        st = self.state
        for pid in reversed(st.pids):
            try:
                os.killpg(pid, signal.SIGTERM) if _is_group_leader(pid) else os.kill(pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.time() + 5
        for pid in st.pids:
            while time.time() < deadline and _alive(pid):
                time.sleep(0.05)
            if _alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for ns in reversed(st.netns):
            _sh("ip", "netns", "del", ns, check=False)
        for link in st.links:
            _sh("ip", "link", "del", link, check=False)
        shutil.rmtree(st.dir, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of ours counts as gone
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True


def _is_group_leader(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False
