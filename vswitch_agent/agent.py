"""The agent: register, heartbeat, watch the controller, and reconcile br-int, over and over.

Level-triggered: every pass computes the full desired flow set from the latest HostConfig and the plugged
interfaces, reads the installed flows back, and applies only the difference. Nothing is flushed on start,
on a controller outage or on a switch reconnect, so traffic keeps flowing while the agent catches up.
Runs inside os-ken (eventlet): the switch connects to the embedded OpenFlow controller on 127.0.0.1.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from os_ken.lib import hub
from os_ken.ofproto import ofproto_v1_3

from controller.hostconfig import HostConfig, HostConfigDelta, apply_delta
from controller.statusfile import write_atomic
from vswitch_agent import dhcp, openflow
from vswitch_agent.flows import Flow, compute_flows
from vswitch_agent.ovsdb import Ovsdb

log = logging.getLogger("tianji.agent")


@dataclass
class AgentOptions:
    host: str
    controller: str
    token: str
    vtep_ip: str  # address/prefix on br-phy
    underlay_if: str
    ovs_rundir: str | None = None
    datapath: str = "netdev"
    of_port: int = 6653
    state_dir: Path = field(default_factory=lambda: Path("/run/tianji"))
    audit_interval: float = 2.0
    heartbeat_interval: float = 2.0

    @property
    def vtep_addr(self) -> str:
        return str(ipaddress.IPv4Interface(self.vtep_ip).ip)


def status_path(state_dir: Path, host: str) -> Path:
    return state_dir / f"agent-{host}.json"


class ZoneMap:
    """Conntrack zones are 16 bits and VNIs 24: each VPC with ports here gets a zone of its own, kept in a file
    so a restarted agent computes the same flows (and established connections keep their state)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.zones: dict[str, int] = json.loads(path.read_text())
        except (OSError, ValueError):
            self.zones = {}
        self.saved = dict(self.zones)  # what the file holds: written only when the map changes

    def assign(self, vpc_ids: set[str], vnis: dict[str, int]) -> dict[str, int]:
        result: dict[str, int] = {}
        for vid in sorted(vpc_ids):  # keep what was assigned before
            z = self.zones.get(vid)
            if z is not None and z not in result.values():
                result[vid] = z
        taken = set(result.values())
        for vid in sorted(vpc_ids - result.keys()):
            z = vnis[vid] % 65521 + 1
            while z in taken:
                z = z % 65535 + 1
            result[vid] = self.zones[vid] = z
            taken.add(z)
        if self.zones != self.saved or not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.zones))
            self.saved = dict(self.zones)
        return result


class Flag:
    """A wake-up flag polled on the hub. (os-ken's hub.Event.wait(timeout) never returns with the eventlet
    release this project pins, so timeouts are done by sleeping in small steps.)"""

    def __init__(self) -> None:
        self.value = False

    def set(self) -> None:
        self.value = True

    def clear(self) -> None:
        self.value = False

    def wait(self, timeout: float, step: float = 0.005) -> bool:
        deadline = time.monotonic() + timeout
        while not self.value and time.monotonic() < deadline:
            hub.sleep(step)
        return self.value


class ControllerApi:
    """urllib (green under eventlet) rather than httpx: the agent's whole I/O runs on os-ken's hub."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url.rstrip("/"), token

    def call(self, method: str, path: str, body: Any = None, timeout: float = 10) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": f"Bearer {self.token}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
                return r.status, (json.loads(raw) if raw else None)
        except urllib.error.HTTPError as e:
            if e.code == 304:
                return 304, None
            raise


class AgentApp(app_manager.OSKenApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]
    options: AgentOptions  # set by run() before os-ken instantiates the app

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        o = self.opts = AgentApp.options
        self.api = ControllerApi(o.controller, o.token)
        self.ovsdb = Ovsdb(o.ovs_rundir)
        self.zones = ZoneMap(o.state_dir / f"zones-{o.host}.json")
        self.dp: Any = None
        self.cfg: HostConfig | None = None
        self.ofports: dict[str, int] = {}
        self.tunnel_ofport: int | None = None
        self.ifaces_known = False
        self.installed: dict[int, str] = {}  # cookie -> fingerprint, from the last read-back
        self.baseline: dict[int, str] = {}  # cookie -> fingerprint as first seen after we installed it
        self.stats_acc: list = []
        self.stats_done = Flag()
        self.wake = Flag()
        self.state: dict[str, Any] = {"host": o.host, "revision": None, "flows": 0, "last_error": None,
                                      "started": time.time(), "reconciles": 0, "flow_adds": 0, "flow_deletes": 0,
                                      "drops": {}, "ports": {}}
        self.by_cookie: dict[int, Flow] = {}

    # --- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> Any:
        t = super().start()
        for fn in (self._watch_loop, self._ovsdb_loop, self._reconcile_loop, self._heartbeat_loop):
            self.threads.append(hub.spawn(self._forever, fn))
        return t

    def _forever(self, fn: Any) -> None:
        while True:
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - a loop must survive anything and retry
                self._error(f"{fn.__name__}: {e}")
                hub.sleep(1.0)

    def _error(self, msg: str) -> None:
        log.warning(msg)
        self.state["last_error"] = {"at": time.time(), "message": msg}

    # --- controller ----------------------------------------------------------------------------------------
    def _register(self) -> None:
        self.api.call("POST", "/v1/hosts", {"name": self.opts.host, "vtep_ip": self.opts.vtep_addr,
                                            "kind": "hypervisor"})
        log.info("registered host %s (VTEP %s) with %s", self.opts.host, self.opts.vtep_addr, self.opts.controller)

    def _watch_loop(self) -> None:
        self._register()
        after = -1
        while True:
            # the delta form: a change in one VPC sends that VPC's sections, not the host's whole config
            code, body = self.api.call("GET", f"/v1/hosts/{self.opts.host}/config/delta?after={after}&timeout=25",
                                       timeout=40)
            if code == 200 and body is not None:
                delta = HostConfigDelta.model_validate(body)
                cfg = apply_delta(self.cfg if after >= 0 else None, delta)
                if cfg is None:  # the delta does not fit what we hold: start again from a whole config
                    log.warning("config delta %d -> %d does not apply; asking for the whole config", delta.base,
                                delta.revision)
                    after = -1
                    continue
                after = cfg.revision
                self.cfg = cfg
                log.info("config revision %d (%s): %d ports, %d VPCs, %d endpoints", cfg.revision,
                         "whole" if delta.base < 0 else f"{len(delta.changed_vpcs)} VPC(s) changed", len(cfg.ports),
                         len(cfg.vpcs), len(cfg.endpoints))
                self.wake.set()

    def _heartbeat_loop(self) -> None:
        while True:
            ports = {}
            if self.cfg is not None and self.ifaces_known:
                ports = {p.id: ("UP" if p.id in self.ofports and self.dp is not None else "DOWN")
                         for p in self.cfg.ports}
            self.state["ports"] = ports
            try:
                self.api.call("POST", f"/v1/hosts/{self.opts.host}/status",
                              {"ports": ports, "revision_applied": self.state["revision"]})
            except urllib.error.HTTPError as e:
                if e.code == 404:  # the controller forgot us (fresh database): register again
                    self._register()
                else:
                    raise
            self._write_status()
            hub.sleep(self.opts.heartbeat_interval)

    # --- OVSDB ---------------------------------------------------------------------------------------------
    def _ovsdb_loop(self) -> None:
        while True:
            ports, tunnel = self.ovsdb.interfaces()
            if (ports, tunnel) != (self.ofports, self.tunnel_ofport) or not self.ifaces_known:
                added = set(ports) - set(self.ofports)
                removed = set(self.ofports) - set(ports)
                if added or removed:
                    log.info("interfaces: plugged %s, unplugged %s", sorted(added), sorted(removed))
                self.ofports, self.tunnel_ofport, self.ifaces_known = ports, tunnel, True
                self.wake.set()
            hub.sleep(0.1)

    # --- OpenFlow ------------------------------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def _features(self, ev: Any) -> None:
        dp = ev.msg.datapath
        dp.send_msg(dp.ofproto_parser.OFPSetConfig(dp, dp.ofproto.OFPC_FRAG_NORMAL, 0xFFFF))
        self.dp = dp
        self.baseline.clear()
        log.info("switch connected (dpid %016x)", dp.id)
        self.wake.set()

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    def _disconnected(self, ev: Any) -> None:
        if self.dp is not None and ev.datapath.id == self.dp.id:
            log.warning("switch disconnected; its flows stay in place (fail mode secure)")
            self.dp = None

    @set_ev_cls(ofp_event.EventOFPFlowStatsReply, MAIN_DISPATCHER)
    def _flow_stats(self, ev: Any) -> None:
        self.stats_acc.extend(ev.msg.body)
        if not ev.msg.flags & ev.msg.datapath.ofproto.OFPMPF_REPLY_MORE:
            self.stats_done.set()

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def _of_error(self, ev: Any) -> None:
        msg = ev.msg
        self._error(f"switch refused a message: type={msg.type} code={msg.code} data={bytes(msg.data)[:64].hex()}")

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def _packet_in(self, ev: Any) -> None:
        msg = ev.msg
        try:
            in_port = msg.match["in_port"]
            cfg = self.cfg
            port_id = next((pid for pid, of in self.ofports.items() if of == in_port), None)
            if cfg is None or port_id is None:
                return
            port = next(p for p in cfg.ports if p.id == port_id)
            vpc = next(v for v in cfg.vpcs if v.id == port.vpc_id)
            subnet = next(s for s in vpc.subnets if s.id == port.subnet_id)
            out = dhcp.reply(bytes(msg.data), ip=port.ip, cidr=subnet.cidr, gateway_ip=subnet.gateway_ip,
                             router_mac=vpc.router_mac, mtu=cfg.mtu)
            if out is not None:
                msg.datapath.send_msg(openflow.packet_out(msg.datapath, in_port, out))
                log.info("DHCP: %s gets %s/%s via %s", port_id, port.ip, subnet.cidr.split("/")[1],
                         subnet.gateway_ip)
        except Exception as e:  # noqa: BLE001 - malformed packet-ins never take the agent down
            self._error(f"packet-in: {e}")

    def _dump_flows(self, dp: Any) -> list | None:
        self.stats_acc = []
        self.stats_done.clear()
        dp.send_msg(openflow.flow_stats_request(dp))
        if not self.stats_done.wait(timeout=10):
            self._error("flow stats request timed out")
            return None
        return self.stats_acc

    # --- reconcile -----------------------------------------------------------------------------------------
    def _reconcile_loop(self) -> None:
        while True:
            self.wake.wait(timeout=self.opts.audit_interval)
            self.wake.clear()
            self.reconcile()

    def reconcile(self) -> None:
        dp, cfg = self.dp, self.cfg
        if dp is None or cfg is None or not self.ifaces_known:
            return  # never act on partial knowledge: what is installed keeps forwarding
        local_vpcs = {p.vpc_id for p in cfg.ports}
        zones = self.zones.assign(local_vpcs, {v.id: v.vni for v in cfg.vpcs})
        desired = {f.cookie: f for f in compute_flows(cfg, self.ofports, self.tunnel_ofport, zones)}
        stats = self._dump_flows(dp)
        if stats is None:
            return
        installed: dict[int, str] = {}
        drops: dict[str, int] = {}
        for s in stats:
            installed[s.cookie] = openflow.fingerprint(s)
            if s.priority == 0 and not s.instructions:
                drops[str(s.table_id)] = s.packet_count
        tampered = [c for c in desired if c in installed and c in self.baseline and self.baseline[c] != installed[c]]
        to_add = [f for c, f in desired.items() if c not in installed] + [desired[c] for c in tampered]
        added = {f.cookie for f in to_add}
        to_delete = [c for c in installed if c not in desired]
        for f in to_add:  # adds first: a changed flow replaces its predecessor without a gap
            dp.send_msg(openflow.flow_add(dp, f))
        for c in to_delete:
            dp.send_msg(openflow.flow_delete_cookie(dp, c))
        if to_add or to_delete:
            dp.send_msg(dp.ofproto_parser.OFPBarrierRequest(dp))
            log.info("revision %d: +%d -%d flows (%d edited by hand restored), %d desired", cfg.revision,
                     len(to_add), len(to_delete), len(tampered), len(desired))
            for c in added:
                self.baseline.pop(c, None)
        for c, fp in installed.items():
            if c in desired and c not in self.baseline and c not in added:
                self.baseline[c] = fp
        for c in list(self.baseline):
            if c not in desired:
                del self.baseline[c]
        self.by_cookie = desired
        st = self.state
        st["revision"] = cfg.revision if not to_add and not to_delete else st["revision"]
        if not to_add and not to_delete and st.get("converged_revision") != cfg.revision:
            st["converged_at"], st["converged_revision"] = time.time(), cfg.revision
            self._write_status()
        st["flows"], st["reconciles"] = len(desired), st["reconciles"] + 1
        st["flow_adds"] += len(to_add)
        st["flow_deletes"] += len(to_delete)
        st["drops"] = drops
        if to_add or to_delete:
            self.wake.set()  # verify on the next pass: a revision counts as applied once read back

    def _write_status(self) -> None:
        write_atomic(status_path(self.opts.state_dir, self.opts.host),
                     json.dumps(self.state | {"controller": self.opts.controller, "pid": os.getpid(),
                                              "switch_connected": self.dp is not None,
                                              "desired_revision": self.cfg.revision if self.cfg else None,
                                              "updated": time.time()}, indent=1))


def setup_host(o: AgentOptions) -> None:
    """OVSDB bridges and the VTEP address on br-phy (idempotent)."""
    from pyroute2 import IPRoute

    ovsdb = Ovsdb(o.ovs_rundir)
    ovsdb.ensure_bridges(datapath=o.datapath, of_port=o.of_port, underlay_if=o.underlay_if, vtep_ip=o.vtep_addr)
    iface = ipaddress.IPv4Interface(o.vtep_ip if "/" in o.vtep_ip else f"{o.vtep_ip}/24")
    with IPRoute() as ipr:
        for name in (o.underlay_if,):  # the VTEP address lives on br-phy, not on the NIC
            idx = ipr.link_lookup(ifname=name)
            if idx:
                for a in ipr.get_addr(index=idx[0], family=2):
                    if a.get_attr("IFA_ADDRESS") == str(iface.ip):
                        ipr.addr("del", index=idx[0], address=str(iface.ip), prefixlen=a["prefixlen"])
                ipr.link("set", index=idx[0], state="up")
        deadline = time.time() + 10
        while not (idx := ipr.link_lookup(ifname="br-phy")):
            if time.time() > deadline:
                raise RuntimeError("br-phy did not appear")
            time.sleep(0.1)
        have = {a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(index=idx[0], family=2)}
        if str(iface.ip) not in have:
            ipr.addr("add", index=idx[0], address=str(iface.ip), prefixlen=iface.network.prefixlen)
        ipr.link("set", index=idx[0], state="up")


def run(o: AgentOptions) -> None:
    """Start the agent and block. os-ken's hub (eventlet) runs everything."""
    hub.patch(thread=True)
    from os_ken import cfg as oscfg
    from os_ken.controller import controller  # noqa: F401 - registers the --ofp-* options

    o.state_dir.mkdir(parents=True, exist_ok=True)
    setup_host(o)
    oscfg.CONF(args=[f"--ofp-tcp-listen-port={o.of_port}", "--ofp-listen-host=127.0.0.1"], project="os_ken")
    AgentApp.options = o
    mgr = app_manager.AppManager.get_instance()
    mgr.load_apps(["vswitch_agent.agent", "os_ken.controller.ofp_handler"])
    services = mgr.instantiate_apps(**mgr.create_contexts())
    log.info("agent %s: OpenFlow on 127.0.0.1:%d, controller %s", o.host, o.of_port, o.controller)
    try:
        hub.joinall(services)
    finally:
        mgr.close()
