"""The emulated cluster: bring it up from a topology file, add VMs, tear down exactly what was made.

State lives in `<state_dir>/state.json`, written as things are created, so `down` also works after a crash.
Processes are stopped by PID, namespaces and links deleted by name; nothing else on the machine is touched.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tianji.southbound import GATEWAY_ROLES
from topologies import dpdk_host, netns, service_host
from topologies.cluster_state import State, load_topology
from topologies.control_plane import (  # noqa: F401 -- TIANJI, controller_env: imported from here
    CONTROLLER_MGMT_IP,
    GATEWAY_KEYS,
    TIANJI,
    ControlPlane,
    alive,
    controller_env,
    stop_group,
)
from topologies.hosts import read_status
from topologies.machines import GatewayHost, Hypervisor, Vm
from topologies.wiring import underlay_mtu, wire
from vswitch_agent.ovsdb import AFXDP

MGMT_NET = ipaddress.IPv4Network(f"{CONTROLLER_MGMT_IP}/24", strict=False)
EIP_POOL = "203.0.113.0/24"  # the operator's public addresses in the emulation (RFC 5737 TEST-NET-3)
DEFAULT_STATE = Path("/run/tianji-cluster")


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


class Cluster(ControlPlane):
    def __init__(self, state: State) -> None:
        self.state = state
        self.net = None  # the Mininet object, only in the process that ran `up`

    # --- bring-up ------------------------------------------------------------------------------------------
    @classmethod
    def up(cls, topology: str = "small", *, name: str = "tj", state_dir: Path = DEFAULT_STATE,
           database_url: str | None = None, controllers: int | None = None, release: str | None = None,
           progress=print) -> Cluster:
        """`release`: the `tianji` every process runs (an earlier release's, topologies/releases.py), else this
        checkout's."""
        from mininet.log import setLogLevel

        from topologies.hosts import check_prerequisites

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
        replicas = controllers or int(topo.get("controllers", 1))
        if replicas > 1 and not database_url:
            raise SystemExit(f"topology {topology!r} runs {replicas} controller replicas: they share a PostgreSQL "
                             "database; give --database-url (TIANJI_DATABASE_URL)")
        st = State(name=name, dir=str(sdir), topology=topo, database_url=database_url or "")
        if release:
            names = [*(f"controller-{i}" for i in range(replicas)), *topo["hypervisors"],
                     *(n for k in GATEWAY_KEYS for n in topo.get(k, []))]
            st.releases = dict.fromkeys(names, release)
        st.save()
        c = cls(st)
        try:
            c._make_certificates()
            # the controller(s), on SQLite in the cluster's state directory unless a database URL is given
            for i in range(replicas):
                st.controllers.append({"port": _free_port(), "dir": str(sdir / ("controller" if i == 0 else
                                                                              f"controller-{i}")), "pid": None})
            st.controller_port = st.controllers[0]["port"]
            st.controller_url = ",".join(f"https://127.0.0.1:{x['port']}" for x in st.controllers)
            for i in range(replicas):
                c.start_controller(i)
                if i == 0:  # the first migrates and makes the admin token; the others find both
                    c._admin(wait=True)
            progress(f"controller{'s' if replicas > 1 else ''} started (pid "
                     f"{', '.join(str(x['pid']) for x in st.controllers)}) on port "
                     f"{', '.join(str(x['port']) for x in st.controllers)}, TLS with client certificates; "
                     + (f"{replicas} replicas on PostgreSQL" if replicas > 1 else
                        "PostgreSQL" if st.database_url else "SQLite"))
            c.net = wire(st, MGMT_NET, EIP_POOL)
            progress(f"Mininet: {len(st.hypervisors)} hypervisors, {len(st.nodes)} other nodes, underlay "
                     f"{topo.get('underlay', '172.31.0.0/24')}")
            c._issue_credentials()
            for hv_name in st.hypervisors:  # OVS and agents on every hypervisor, then wait until all report in
                st.pids += c.hypervisor(hv_name).start_ovs()
                st.save()
                c.start_agent(hv_name)
            progress("agents started; waiting for every agent to report in ...")
            c.wait_agents(timeout=60)
            for hv_name in topo.get("dpdk_hypervisors", []):  # OVS-DPDK, for vhost-user guests (dpdk_host.py)
                dpdk_host.enable(c, hv_name, progress)
            service_host.start_all(st)
            if gateways := [n for n, i in st.nodes.items() if i["role"] == "gateway"]:
                c.admin.post("/v1/eip-pools", {"cidr": EIP_POOL})
                for n in gateways:
                    c.start_gateway(n)
                c.wait_gateways(timeout=30)
                by_role = {r: [n for n in gateways if st.nodes[n].get("gateway_role", "nat") == r]
                           for r in GATEWAY_ROLES}
                progress(f"gateway instances up: NAT {', '.join(by_role['nat']) or '-'}, load balancer "
                         f"{', '.join(by_role['lb']) or '-'}, private line {', '.join(by_role['private-line']) or '-'}"
                         f", service {', '.join(by_role['service']) or '-'}; EIP pool {EIP_POOL}")
            st.up_seconds = round(time.monotonic() - t0, 2)
            st.save()
            progress(f"cluster {name!r} up in {st.up_seconds} s")
            return c
        except BaseException:
            c.down()
            raise

    def agent_status(self, hv: str) -> dict:
        return read_status(Path(self.state.dir) / "agents" / f"agent-{hv}.json")

    def wait_agents(self, timeout: float = 30) -> None:
        deadline = time.time() + timeout
        want = set(self.state.hypervisors)
        while True:
            up = {h["name"] for h in self.admin.get("/v1/hosts") if h["status"] == "up"}
            ready = {h for h in want if self._agent_ready(h)}
            if want <= up and want <= ready:
                return
            if time.time() > deadline:
                raise SystemExit(f"agents not ready after {timeout}s: {sorted(want - (up & ready))}; "
                                 f"see {self.state.dir}/agent-*.log")
            time.sleep(0.1)

    def _agent_ready(self, hv: str) -> bool:
        """Connected to its switch, said by the agent running now: a killed agent's status file stays behind."""
        status = self.agent_status(hv)
        return bool(status.get("switch_connected")) and status.get("pid") == self.state.hypervisors[hv]["agent_pid"]

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

    def vm_add(self, port_id: str, name: str | None = None, dhcp: bool = True, kind: str = "netns",
               progress=print, nic: str = "tap") -> dict:
        """Plug a VM for a port on the port's host (the way Nova/OVN plug: a veth, or a KVM guest's tap or
        vhost-user socket, and iface-id). `kind`: `netns` (a namespace, quick) or `kvm` (a QEMU guest with its own
        kernel; `nic`: tap, or vhost-user on an OVS-DPDK host)."""
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
        if kind == "kvm":
            from topologies.cluster_guests import kvm_add

            return kvm_add(self, port, name, progress, nic)
        if kind != "netns":
            raise SystemExit(f"--kind {kind!r}: netns or kvm")
        ns = f"{st.name}-{name}"
        st.netns.append(ns)
        st.save()
        hv = self.hypervisor(port["host"])
        vm = Vm(name, ns, hv, port_id, f"tp{port_id[:8]}", port["mac"])
        vm_node, hv_node = VmNode(name, nsname=ns), HypervisorNode(hv.name, nsname=hv.ns)
        Link(vm_node, hv_node, intfName1="eth0", intfName2=vm.tap)
        vm_node.terminate()  # the shells are no longer needed; the named namespaces and their link stay
        hv_node.terminate()
        underlay = underlay_mtu(st.topology)
        vm.configure(self.admin.get(f"/v1/vpcs/{port['vpc_id']}")["mtu"], tap_mtu=underlay - 50)
        port_type = AFXDP if self.agent_status(port["host"]).get("port_types", {}).get(
            "underlay") == AFXDP else "system"  # the agent found AF_XDP works on this host's veths
        vm.plug(port_id, port_type)
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
        if (kind := st.vms.get(name, {}).get("kind")) in ("kvm", "container"):
            from topologies.cluster_guests import kvm_remove
            from topologies.containers import container_remove

            (kvm_remove if kind == "kvm" else container_remove)(self, name)
            st.vms.pop(name)
            st.save()
            return
        info = st.vms.pop(name)
        self.hypervisor(info["host"]).unplug(info["tap"])
        _sh("ip", "netns", "del", info["ns"], check=False)
        if info["ns"] in st.netns:
            st.netns.remove(info["ns"])
        st.save()

    def vm_exec(self, name: str, *cmd: str, check: bool = False, timeout: float = 30) -> subprocess.CompletedProcess:
        kind = self.state.vms.get(name, {}).get("kind")
        if kind == "kvm":  # a guest's own shell, on its serial console
            from topologies.cluster_guests import kvm_exec

            return kvm_exec(self, name, cmd, timeout)
        if kind == "container":
            from topologies.containers import container_exec

            return container_exec(self, name, cmd, timeout)
        ns = self.state.vms[name]["ns"] if name in self.state.vms else f"{self.state.name}-{name}"
        r = netns.sh(*cmd, ns=ns, check=False, timeout=timeout)
        if check and r.returncode:
            raise RuntimeError(f"{name}: {' '.join(cmd)}: {r.stderr.strip()}")
        return r

    # --- the service network -------------------------------------------------------------------------------
    def service_address(self, kind: str) -> tuple[str, int]:
        """Where the emulated service `kind` (store, db) listens on the service network."""
        return service_host.address_of(self.state, kind)

    # --- gateways ------------------------------------------------------------------------------------------
    def start_gateway(self, name: str, *extra: str) -> int:
        """Start the gateway instance `name` (`extra`: more of `tianji gateway run`'s flags, e.g. edge routing)."""
        st = self.state
        info = st.nodes[name]
        host = GatewayHost(name, info["ns"], info["underlay_ip"], info.get("gateway_role", "nat"))
        source = ["--controller", self.urls_from(str(MGMT_NET.network_address + 1)), "--token",
                  st.host_tokens[name], *self.tls_args(name)]
        # a load balancer remembers 5,000 new connections/s here: a SYN flood from one namespace goes above it
        lb = ["--lb-new-per-s", os.environ.get("TIANJI_LB_NEW_PER_S", "5000")] if host.role == "lb" else []
        # beats as the controller asks (a fifth of its silence: 0.1 s here) unless TIANJI_GATEWAY_BEAT says
        beat = ["--beat-interval", os.environ["TIANJI_GATEWAY_BEAT"]] if os.environ.get("TIANJI_GATEWAY_BEAT") else []
        pid = host.start(self.release_of(name), source, Path(st.dir) / "gateways", Path(st.dir) / f"gateway-{name}.log",
                         *beat, *lb, *extra)
        info["pid"] = pid
        st.pids.append(pid)
        st.save()
        return pid

    def kill_gateway(self, name: str) -> None:
        stop_group(self.state.nodes[name]["pid"], signal.SIGKILL)
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
        stop_group(self.state.hypervisors[hv]["agent_pid"], sig)

    def start_agent(self, hv: str) -> int:
        st = self.state
        info = st.hypervisors[hv]
        pid = self.hypervisor(hv).start_agent(self.release_of(hv), self.urls_from(info["controller_ip"]),
                                              st.host_tokens[hv], Path(st.dir) / "agents",
                                              Path(st.dir) / f"agent-{hv}.log", self.tls_args(hv))
        info["agent_pid"] = pid
        st.pids.append(pid)
        st.save()
        return pid

    # --- teardown ------------------------------------------------------------------------------------------
    def down(self) -> None:
        st = self.state
        from topologies.containers import remove_all

        remove_all(self)  # while the controller runs, so the plugin's DEL deletes the ports; and the conflists
        if any(h.get("libvirtd_pid") for h in st.hypervisors.values()):
            from topologies import libvirt_host

            libvirt_host.stop(self)
        for pid in reversed(st.pids):
            try:
                os.killpg(pid, signal.SIGTERM) if _is_group_leader(pid) else os.kill(pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.time() + 5
        for pid in st.pids:
            while time.time() < deadline and alive(pid):
                time.sleep(0.05)
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        # the private-line instances' session namespaces and the edge speakers' (one directory each), should an
        # instance have been killed before it removed them
        gws = Path(st.dir) / "gateways"
        speakers = [*(gws / "lines").glob("tjl-*"), *(gws / "edge").glob("tje-*")]
        for ns in [*reversed(st.netns), *(p.name for p in speakers)]:
            _sh("ip", "netns", "del", ns, check=False)
        for link in st.links:
            _sh("ip", "link", "del", link, check=False)
        for end in _node_ends_left(st):  # a node's namespace the kernel still holds keeps its link's end here
            _sh("ip", "link", "del", end, check=False)
        dpdk_host.release(self)
        shutil.rmtree(st.dir, ignore_errors=True)


def _node_ends_left(st: State) -> list[str]:
    """The root-namespace ends of the cluster's node links (wiring.py names them NAME+NODE+one letter) still here."""
    nodes = [*st.hypervisors, *st.nodes]
    ours = {f"{st.name}{n}{c}"[:15] for n in nodes for c in "uhmsx"}
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return [name for line in out.splitlines() if (name := line.split(":")[1].strip().split("@")[0]) in ours]


def _is_group_leader(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False
