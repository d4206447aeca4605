"""The agent: register, heartbeat, watch the controller and the switch's interfaces, and keep br-int programmed.

Incremental and level-triggered at once. A change (a config delta naming the VPCs it touched, a VIF plugged or
unplugged, seen through an OVSDB monitor) rebuilds the flows of those objects only (`engine.FlowEngine`), and the
difference goes to the switch as one atomic bundle. Nothing is read back for a change: the agent knows what it
installed. Reading back is the audit's job, in the background (`audit.py`): chunk by chunk, rate-limited,
and at full speed right after every (re)connect, so whatever happened to the switch meanwhile (an ovs-vswitchd
restart that lost every flow, flows deleted or edited by hand) is put right. Nothing is flushed on start, on a
controller outage or on a switch reconnect, so traffic keeps flowing while the agent catches up.
Runs inside os-ken, on its native-thread hub: the switch connects to the embedded OpenFlow controller on 127.0.0.1.
Each loop (watch, OVSDB monitor, program, heartbeat) is a thread; os-ken's event thread runs the OpenFlow handlers.
"""

from __future__ import annotations

import faulthandler
import functools
import json
import logging
import os
import signal
import threading
import time
from typing import Any

from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import CONFIG_DISPATCHER, DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from os_ken.lib import hub
from os_ken.ofproto import ofproto_v1_3

from tianji.host_delta import apply_delta
from tianji.southbound import HostConfig, HostConfigDelta
from tianji.southbound_client import Southbound, SouthboundError, next_refresh
from tianji.statusfile import write_atomic
from vswitch_agent import adverts, dns, health, icmp, live_trace, metrics, openflow, punts
from vswitch_agent.audit import Audit
from vswitch_agent.dns_forward import Forwarder
from vswitch_agent.engine import FlowEngine
from vswitch_agent.host import AgentOptions, ZoneMap, setup_host, status_path
from vswitch_agent.lb_members import LocalMembers
from vswitch_agent.osken_compat import wake_sender_when_receive_ends
from vswitch_agent.ovsdb import Ovsdb
from vswitch_agent.switch import Session, SwitchGone
from vswitch_agent.underlay_neighbours import UnderlayNeighbours

log = logging.getLogger("tianji.agent")


class AgentApp(app_manager.OSKenApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]
    options: AgentOptions  # set by run() before os-ken instantiates the app

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        o = self.opts = AgentApp.options
        self.api = Southbound(o.controller, o.token, tls=o.tls)
        self.api.on_failover = lambda _url: self._write_status()  # which controller we use, said at once
        self.api.events["trace"] = lambda data: hub.spawn(self._live_trace, data)  # the analyzer's --live
        self.zones = ZoneMap(o.state_dir / f"zones-{o.host}.json")
        self.engine = FlowEngine()
        self.session: Session | None = None  # the current OpenFlow connection
        self.cfg: HostConfig | None = None
        self.after = -1  # the revision the watch asks from: what self.cfg is, -1 for a whole config
        self.hints: set[str] | None = None  # VPCs to rebuild at the next pass; None: everything
        self.ofports: dict[str, int] = {}
        self.tunnel_ofport: int | None = None
        self.ifaces_known = False
        self.wake = threading.Event()
        self.icmp_limit = icmp.RateLimit()  # time-exceeded answers (traceroute through the distributed router)
        self.fresh_ports = adverts.Fresh()  # ports the router has advertised to since they were plugged
        self.dns_limit = icmp.RateLimit(500.0, 1000)  # the VPCs' resolver: a VM's flood must not take the agent
        self.dns_forwarder = Forwarder(o.dns_forwarder, self._packet_out) if o.dns_forwarder else None
        self.prober = health.Prober(self._packet_out, lambda ms: self.api.call(  # load-balancer members here
            "POST", f"/v1/hosts/{o.host}/lb-health", {"members": ms}))
        self.lb_members = LocalMembers(self.prober)
        self.underlay = UnderlayNeighbours(o.ovs_rundir, o.vtep_addr)
        self.hints_lock = threading.Lock()  # the watch and OVSDB threads add hints; the program thread takes them
        self.state: dict[str, Any] = {"host": o.host, "revision": None, "flows": 0, "last_error": None,
                                      "started": time.time(), "passes": 0, "flow_adds": 0, "flow_deletes": 0,
                                      "audit_repairs": 0, "audit_sweeps": 0, "connects": 0, "drops": {},
                                      "whole_configs": 0, "ports": {}, "last_change_ms": None, "errors": 0,
                                      "packet_ins": {}}
        self.audit = Audit(o, self.engine, self.state, self.wake.set)

    # --- lifecycle -----------------------------------------------------------------------------------------
    def start(self) -> Any:
        t = super().start()
        for fn in (self._watch_loop, self._ovsdb_loop, self._program_loop, self._heartbeat_loop,
                   functools.partial(self.prober.run, hub.sleep), functools.partial(self.underlay.run, hub.sleep),
                   functools.partial(adverts.run, hub.sleep, lambda: self.cfg, lambda: self.ofports, self._packet_out),
                   *((self.dns_forwarder.run,) if self.dns_forwarder else ())):
            self.threads.append(hub.spawn(self._forever, fn))
        if self.opts.metrics_port:
            collector = metrics.AgentCollector(self.opts.host, self.status, lambda: list(self.engine.desired.values()))
            self.threads.append(hub.spawn(metrics.serve, collector, self.opts.metrics_port, self.opts.metrics_address))
        return t

    def _forever(self, fn: Any) -> None:
        while True:
            try:
                fn()
            except Exception as e:  # a loop must survive anything and retry
                self._error(f"{getattr(fn, '__name__', 'health probes')}: {e}")
                hub.sleep(1.0)

    def _error(self, msg: str) -> None:
        log.warning(msg)
        self.state["last_error"] = {"at": time.time(), "message": msg}
        self.state["errors"] += 1

    def _hint(self, vpcs: set[str] | None) -> None:
        with self.hints_lock:
            if vpcs is None or self.hints is None:
                self.hints = None
            else:
                self.hints |= vpcs
        self.wake.set()

    def _take_hints(self) -> set[str] | None:
        with self.hints_lock:
            hints, self.hints = self.hints, set()
        return hints

    # --- controller ----------------------------------------------------------------------------------------
    def _register(self) -> None:
        self.api.register(self.opts.host, self.opts.vtep_addr, "hypervisor")
        log.info("registered host %s (VTEP %s) with %s", self.opts.host, self.opts.vtep_addr, self.api.current)

    def _watch_loop(self) -> None:
        """The delta watch: a change in one VPC sends that VPC's sections, not the host's whole config. Through a
        controller outage it keeps its revision and asks from there when the controller answers again."""
        self._register()
        params = lambda: {"after": self.after, "form": "objects"}  # noqa: E731
        if not self.api.stream(f"/v1/hosts/{self.opts.host}/config/stream", HostConfigDelta, params,
                               self._take_delta, lambda e: self._error(f"watch: {e}")):
            log.warning("the controller has no config stream (an older version): long-polling instead")
            self.api.watch(f"/v1/hosts/{self.opts.host}/config/delta", HostConfigDelta, params, self._take_delta,
                           lambda e: self._error(f"watch: {e}"))

    def _take_delta(self, delta: HostConfigDelta, _answer: object) -> None:
        cfg = apply_delta(self.cfg if self.after >= 0 else None, delta)
        if cfg is None:  # the delta does not fit what we hold: start again from a whole config
            log.warning("config delta %d -> %d does not apply; asking for the whole config", delta.base,
                        delta.revision)
            self.after = -1
            return
        self.after = cfg.revision
        self.cfg = cfg
        self.underlay.want(v.ip for v in cfg.vteps)
        if delta.base < 0:  # a whole config: at start, or where no delta fits (never for a connection error)
            self.state["whole_configs"] += 1
        log.info("config revision %d (%s): %d ports, %d VPCs, %d endpoints", cfg.revision,
                 "whole" if delta.base < 0 else f"{len(delta.changed_vpcs)} VPC(s) changed", len(cfg.ports),
                 len(cfg.vpcs), len(cfg.endpoints))
        self._hint(None if delta.base < 0 else set(delta.changed_vpcs))

    def _heartbeat_loop(self) -> None:
        """The port report, every heartbeat interval while the config stream is down; while it is up (it is the
        beat, controller/api/host_stream.py) only when the report changed, when the controller wants it (a new
        stream, its `report` event), and about every REPORT_REFRESH_S (next_refresh: jittered)."""
        sent: dict | None = None
        refresh_at = 0.0
        reported_on = -1  # the api's report_wanted when the last report went
        while True:
            ports = {}
            if self.cfg is not None and self.ifaces_known:
                up = self.session is not None and self.session.swept
                ports = {p.id: ("UP" if up and p.id in self.ofports else "DOWN") for p in self.cfg.ports}
            self.state["ports"] = ports
            try:
                wanted = self.api.report_wanted
                if ports != sent or not self.api.streaming or wanted != reported_on or time.monotonic() >= refresh_at:
                    last = self.state["last_error"]
                    self.api.beat(self.opts.host, {"ports": ports, "revision_applied": self.state["revision"],
                                                   "errors": self.state["errors"],
                                                   "last_error": last["message"][:500] if last else None},
                                  timeout=max(1.0, self.opts.heartbeat_interval))
                    sent, refresh_at, reported_on = ports, next_refresh(time.monotonic()), wanted
            except SouthboundError as e:
                if e.status == 404:  # the controller forgot us (fresh database): register again
                    self._register()
                else:
                    raise
            self._write_status()
            hub.sleep(self.opts.heartbeat_interval)

    # --- OVSDB: interfaces, pushed by a monitor ------------------------------------------------------------
    def _ovsdb_loop(self) -> None:
        """The IDL pushes each change of the Interface table (the initial rows of every reconnection too); this
        thread reads the table's copy once per wake-up, however many rows one update changed."""
        changed = threading.Event()
        ovsdb = Ovsdb(self.opts.ovs_rundir)
        ovsdb.watch_interfaces(changed.set)
        while True:
            changed.wait()
            changed.clear()
            self.state["port_types"] = {"underlay": self.opts.underlay_port_type, "vifs": ovsdb.vif_types()}
            self._interfaces(*ovsdb.interfaces())

    def _interfaces(self, ports: dict[str, int], tunnel: int | None) -> None:
        if (ports, tunnel) == (self.ofports, self.tunnel_ofport) and self.ifaces_known:
            return
        changed = {p for p in set(ports) | set(self.ofports) if ports.get(p) != self.ofports.get(p)}
        plugged = sorted(set(ports) - set(self.ofports))
        unplugged = sorted(set(self.ofports) - set(ports))
        if plugged or unplugged:
            log.info("interfaces: plugged %s, unplugged %s", plugged[:20], unplugged[:20])
        self.ofports, self.tunnel_ofport, first = ports, tunnel, not self.ifaces_known
        self.ifaces_known = True
        cfg = self.cfg
        vpcs = {p.vpc_id for p in cfg.ports if p.id in changed} if cfg is not None and changed else set()
        self._hint(None if first else vpcs)  # a tunnel port change is seen by the engine itself

    # --- OpenFlow events -----------------------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def _features(self, ev: Any) -> None:
        dp = ev.msg.datapath
        dp.send_msg(openflow.set_config(dp))
        dp.send_msg(openflow.set_async(dp))
        if self.session is not None:
            self.session.end()
        self.session = Session(dp, on_answer=self.wake.set)
        self.state["connects"] += 1
        self.audit.connected()
        log.info("switch connected (dpid %016x): reading its flows back", dp.id)
        self.wake.set()

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    def _disconnected(self, ev: Any) -> None:
        s = self.session
        if s is not None and s.dp is ev.datapath:  # an older connection's death must not end a newer one
            log.warning("switch disconnected; its flows stay in place (fail mode secure)")
            s.end()
            self.session = None
            self._write_status()

    def _session_of(self, dp: Any) -> Session | None:
        s = self.session
        return s if s is not None and s.dp is dp else None

    @set_ev_cls(ofp_event.EventOFPFlowStatsReply, MAIN_DISPATCHER)
    def _flow_stats(self, ev: Any) -> None:
        if (s := self._session_of(ev.msg.datapath)) is not None:
            s.on_stats(ev.msg.xid, ev.msg.body, bool(ev.msg.flags & ev.msg.datapath.ofproto.OFPMPF_REPLY_MORE))

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def _barrier(self, ev: Any) -> None:
        if (s := self._session_of(ev.msg.datapath)) is not None:
            s.on_barrier(ev.msg.xid)

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def _of_error(self, ev: Any) -> None:
        msg = ev.msg
        text = f"switch refused a message: type={msg.type} code={msg.code} data={bytes(msg.data)[:64].hex()}"
        if (s := self._session_of(msg.datapath)) is not None:
            s.on_error(msg.xid, text)
        self._error(text)

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def _packet_in(self, ev: Any) -> None:
        """Health-probe answers (health.py), DHCP and time exceeded (punts.py), the last two rate-limited."""
        msg = ev.msg
        try:
            in_port, data = msg.match["in_port"], bytes(msg.data)
            if self.prober.on_packet(in_port, data, time.time()):
                self._count_in("health_probe")
                return
            port_id = next((pid for pid, of in self.ofports.items() if of == in_port), None)
            if self.cfg is None or port_id is None:
                self._count_in("unclaimed")
                return  # from the tunnel: the routing hop was the sender's host
            if (q := dns.parse(data)) is not None:
                self._count_in("dns")
                self._dns(msg.datapath, in_port, port_id, q)
                return
            expired = msg.reason == msg.datapath.ofproto.OFPR_INVALID_TTL
            too_big = punts.too_big_mtu(msg.match)
            self._count_in(punts.kind(data, expired, too_big))
            if (out := punts.answer(self.cfg, port_id, data, expired, self.icmp_limit, too_big)) is not None:
                msg.datapath.send_msg(openflow.packet_out(msg.datapath, in_port, out))
                if expired:
                    self.state["time_exceeded"] = self.state.get("time_exceeded", 0) + 1
        except Exception as e:  # malformed packet-ins never take the agent down
            self._error(f"packet-in: {e}")

    def _live_trace(self, data: str) -> None:
        """A question about one packet from the reachability analyzer: our switch's own answer, sent back."""
        ident, answer = live_trace.answer(data, dict(self.ofports), self.opts.ovs_rundir)
        if ident is not None:
            try:
                self.api.call("PUT", f"/v1/hosts/{self.opts.host}/traces/{ident}", answer)
            except SouthboundError as e:
                self._error(f"live trace {ident}: {e}")

    def _count_in(self, kind: str) -> None:
        ins = self.state["packet_ins"]
        ins[kind] = ins.get(kind, 0) + 1

    def _dns(self, dp: Any, in_port: int, port_id: str, q: dns.Query) -> None:
        if self.cfg is None or not self.dns_limit.allow():
            self.state["dns_dropped"] = self.state.get("dns_dropped", 0) + 1
            return
        fwd = self.dns_forwarder
        forward = (lambda query, mac: fwd.forward(query, in_port, mac)) if fwd is not None else None
        if (out := punts.dns_answer(self.cfg, port_id, q, forward)) is not None:
            dp.send_msg(openflow.packet_out(dp, in_port, out))
        self.state["dns_queries"] = self.state.get("dns_queries", 0) + 1

    def _packet_out(self, ofport: int, frame: bytes) -> None:  # a health probe (health.py), a DNS answer forwarded
        if (s := self.session) is not None and s.alive:
            s.dp.send_msg(openflow.packet_out(s.dp, ofport, frame))

    # --- programming ---------------------------------------------------------------------------------------
    def _program_loop(self) -> None:
        """One thread does every write to the switch: a change, an audit chunk asked for, a repair. A chunk
        answers with what the switch held before the changes sent after it (audit.py leaves those alone)."""
        while True:
            self.wake.wait(timeout=0.05)
            self.wake.clear()
            try:
                self.program()
                if (s := self.session) is not None and self.cfg is not None and self.ifaces_known:
                    self.audit.step(s)
            except SwitchGone:
                pass  # the connection went away mid-pass: the next one starts with a full read-back
            except TimeoutError as e:
                self._error(f"switch did not answer: {e}")

    def program(self) -> None:
        cfg = self.cfg
        if cfg is None or not self.ifaces_known:
            return  # never act on partial knowledge: what is installed keeps forwarding
        hints = self._take_hints()
        t0 = time.monotonic()
        local_vpcs = {p.vpc_id for p in cfg.ports}
        members = self.lb_members.zone_seeds(cfg, self.ofports)  # zones for their translations (lb_flows)
        zones = self.zones.assign(local_vpcs | members.keys(),
                                  {v.id: v.vni for v in cfg.vpcs if v.id in local_vpcs} | members)
        diff = self.engine.update(cfg, self.ofports, self.tunnel_ofport, zones, hints)
        t_computed = time.monotonic()
        st = self.state
        st["passes"] += 1
        st["flows"] = len(self.engine.desired)
        s = self.session
        if s is None:
            return  # what the switch lacks is found by the read-back after it connects
        if diff:
            problems = s.apply(diff.add, [f.cookie for f in diff.delete])
            for p in problems[:5]:
                self._error(p)
            self.audit.changed(diff.add, [f.cookie for f in diff.delete])
            for of, frame in self.fresh_ports.take(cfg, self.ofports):  # its router, at once (adverts.py)
                self._packet_out(of, frame)
            st["flow_adds"] += len(diff.add)
            st["flow_deletes"] += len(diff.delete)
            done = time.monotonic()
            st["last_change_ms"] = round((done - t0) * 1000, 1)
            log.info("revision %d: +%d -%d flows in %.1f ms (computed in %.1f, the switch took %.1f), %d desired",
                     cfg.revision, len(diff.add), len(diff.delete), st["last_change_ms"], (t_computed - t0) * 1000,
                     (done - t_computed) * 1000, len(self.engine.desired))
        if s.swept and st["revision"] != cfg.revision:
            st["revision"] = cfg.revision
            st["converged_at"], st["converged_revision"] = time.time(), cfg.revision
            self._write_status()

    def status(self) -> dict[str, Any]:
        """What the status file says and the metrics show."""
        s = self.session
        return self.state | {"controller": self.api.current, "pid": os.getpid(),
                             "controller_failovers": self.api.failovers, "streaming": self.api.streaming,
                             "switch_connected": s is not None and s.alive, "switch_synced": s is not None and s.swept,
                             "desired_revision": self.cfg.revision if self.cfg else None, "updated": time.time()}

    def _write_status(self) -> None:
        write_atomic(status_path(self.opts.state_dir, self.opts.host),
                     json.dumps(self.status()))  # compact: C's encoder, 10x faster


def run(o: AgentOptions) -> None:
    """Start the agent and block."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: every thread's stack, in the log
    wake_sender_when_receive_ends()
    from os_ken import cfg as oscfg
    from os_ken.controller import controller  # noqa: F401 - registers the --ofp-* options

    o.state_dir.mkdir(parents=True, exist_ok=True)
    setup_host(o)
    openflow.use_raw_flow_stats()
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
