"""The private-line role: VXLAN in a VPC's VNI on the underlay side, 802.1Q in the line's VLAN on the handoff, both
ways (reference.LineTable), with a BGP session per line placed here (bgp.SessionDaemons) whose learned prefixes
are routed to it and reported to the controller, which makes them the VPC's routes.

The role owns the handoff (the instance's external side): its frames are for the data path, or for a session's
namespace (ARP, BGP, BFD, ping to the line's address). With a native data plane, the C stage (native.NativeLineTable
mirrors the reference's table into it) moves the data path's frames and punts the rest here; without one, the role
reads the handoff on a socket of its own. Sessions are reconciled, level-triggered, by one loop: the
sessions the config places here are started, those it no longer does are stopped, a changed one is restarted."""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nfv_gateways.core.frr import reap_left_by
from nfv_gateways.core.options import GatewayOptions
from nfv_gateways.core.packet import Verdict, ip2int
from nfv_gateways.core.sections import VpcParts
from nfv_gateways.core.underlay import ETH_ARP, ETH_IP, mac_bytes
from nfv_gateways.native.dataplane import EXT
from nfv_gateways.roles.line.bgp import SessionDaemons, SessionSpec, frr_available
from nfv_gateways.roles.line.handoff import BROADCAST, Handoff, arp_frame, untag
from nfv_gateways.roles.line.policy import line_of, specs_of
from nfv_gateways.roles.line.reference import LineTable, LineVerdict, prefix_of
from tianji.served import PrivateLineServed
from tianji.southbound import LineSection
from tianji.southbound_client import SouthboundError

if TYPE_CHECKING:
    from nfv_gateways.core.instance import Instance
    from nfv_gateways.native.dataplane import NativeDataPlane

log = logging.getLogger("tianji.gateway")
HELD = Verdict("held")  # sent on the handoff by the stage itself
POLL_S = 0.5  # sessions' state and learned prefixes read this often
REPORT_EVERY_S = 5.0  # a line's report is sent when it changes, and at least this often
SessionKey = tuple[str, str]  # (line id, local ADDRESS/LEN)


class LineStage:
    """The role's PacketStage: LineTable's verdicts, what leaves on the handoff sent from here."""

    def __init__(self, table: LineTable, handoff: Handoff) -> None:
        self.table, self.handoff, self.counters = table, handoff, table.counters

    def outbound(self, vni: int, buf: bytearray, now: float) -> Verdict | None:
        v = self.table.outbound(vni, buf, now)
        if v is None or v.direction == "in":
            return v
        self.send(v, buf)
        return HELD

    def send(self, v: LineVerdict, buf: bytearray) -> None:
        for pkt in v.fragments or (bytes(buf),):
            self.handoff.send_ip(v.vlan, v.nexthop, v.src, pkt)

    def inbound(self, buf: bytearray, now: float) -> Verdict | None:
        return None  # the handoff's frames come with their VLAN, through LineRole.from_handoff

    def expire(self, now: float) -> int:
        return 0



def quiet_ipv6(ifname: str) -> None:
    """No IPv6 on `ifname` (this namespace's /proc/sys/net is its own, unlike a Mininet host's sysfs)."""
    try:
        Path(f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6").write_text("1")
    except OSError as e:
        log.warning("%s: IPv6 left on (%s): the kernel's router solicitations will reach the handoff", ifname, e)


class LineRole:
    name = "private-line"
    expiry_interval = 5.0
    backends = ("xdp", "dpdk", "packet")  # xdp's flow cache carries a flow in the kernel after its first packet
    cache_lru = 65536  # flows per port in that cache: an LRU, as a line keeps no state to take them back by
    owns_external = True  # the handoff: tagged frames, the sessions' control traffic

    def __init__(self, o: GatewayOptions, counters: Counter[str]) -> None:
        self.o, self.counters = o, counters
        self.table = LineTable(o.handoff_mtu, counters)
        self.mac = o.macs[1] if o.macs else Path(f"/sys/class/net/{o.external_if}/address").read_text().strip()
        self.handoff = Handoff(o.external_if, mac_bytes(self.mac), counters)
        if o.external_if and Path(f"/sys/class/net/{o.external_if}").exists():
            self.handoff.keep_tags()
        if o.external_if:  # the handoff carries the lines' tagged traffic only: not our kernel's IPv6 (RS, DAD)
            quiet_ipv6(o.external_if)
        self.stage = LineStage(self.table, self.handoff)
        self.served: dict[str, tuple[PrivateLineServed, ...]] = {}  # VPC id -> its lines with sessions here
        self.wanted: dict[SessionKey, SessionSpec] = {}
        self.daemons: dict[SessionKey, SessionDaemons] = {}
        self.by_local: dict[tuple[int, int], SessionDaemons] = {}  # (VLAN, local address) -> its session
        self.session_state: dict[SessionKey, dict] = {}
        self.reported: dict[str, tuple[Any, float]] = {}  # line -> (what was reported, when)
        self.changed = threading.Event()
        self.inst: Instance | None = None
        reap_left_by(o.state_dir / "lines", o.name)  # an earlier run's sessions, if it was killed with its reapers

    def attach(self, dp: NativeDataPlane | None) -> LineStage:
        """The data plane owns the handoff (the role sends through it); with its C library, the C stage runs."""
        if dp is None:
            return self.stage
        self.handoff.tx = lambda frame: dp.inject(EXT, frame)
        if dp.lib is not None:
            from nfv_gateways.roles.line.native import NativeLineTable

            self.table = NativeLineTable(dp, self.o.handoff_mtu, self.counters)
            self.stage.table = self.table
            self.handoff.on_learn = self.table.set_neigh
        return self.stage

    def serve_external(self, inst: Instance) -> Callable[[bytes], None]:
        """What the instance calls with each frame the data plane punts from the handoff (tag in the frame)."""
        self.inst = inst
        return lambda frame: self.from_handoff(*untag(frame, []))

    def policy_of(self, section: LineSection) -> tuple[PrivateLineServed, ...]:
        return tuple(section.lines)

    def apply(self, parts: Mapping[str, VpcParts], touched: set[str], first: bool) -> None:
        for vid in touched:
            old = {x.id: x for x in self.served.pop(vid, ())}
            new = {x.id: x for x in (parts[vid].policy if vid in parts else ())}
            for lid in old.keys() - new.keys():
                self.table.remove_line(lid)
            for x in new.values():
                if old.get(x.id) != x:
                    self.table.set_line(line_of(x))
            if new:
                self.served[vid] = tuple(new.values())
        self.wanted = {(s.line_id, s.local): s for lines in self.served.values() for x in lines
                       for s in specs_of(x)}
        self.changed.set()

    def expire(self, now: float) -> None:
        pass

    # --- the handoff ----------------------------------------------------------------------------------------
    def loops(self, inst: Instance) -> list[Callable[[], None]]:
        """The role's own threads: the sessions' reconcile loop, and the handoff's frames unless the data plane
        punts them to serve_external."""
        self.inst = inst
        if (why := frr_available()) is not None:
            log.error("private lines: %s; lines carry their static routes only", why)
        if self.handoff.tx is not None:
            return [self.control_loop]
        self.handoff.open()
        return [self.handoff_loop, self.control_loop]

    def handoff_loop(self) -> None:
        while True:
            got = self.handoff.receive()
            if got is None:
                continue
            try:
                self.from_handoff(*got)
            except Exception as e:  # a malformed frame never takes the gateway down
                self.counters["drop_error"] += 1
                log.debug("handoff frame: %s", e)

    def from_handoff(self, vlan: int | None, frame: bytes) -> None:
        if len(frame) < 14:
            self.counters["drop_malformed"] += 1
            return
        if vlan is None:
            self.counters["drop_untagged"] += 1
            return
        if vlan not in self.table.by_vlan:
            self.counters["drop_unknown_vlan"] += 1
            return
        etype = struct.unpack_from("!H", frame, 12)[0]
        self.handoff.learn(vlan, frame)
        if etype == ETH_ARP:
            d = self.by_local.get((vlan, struct.unpack_from("!I", frame, 38)[0])) if len(frame) >= 42 else None
            if d is not None:
                d.write(frame)  # the session's kernel answers (or takes the answer)
            return
        if etype != ETH_IP or len(frame) < 34:
            self.counters["drop_not_ipv4"] += 1
            return
        if (d := self.by_local.get((vlan, struct.unpack_from("!I", frame, 30)[0]))) is not None:
            d.write(frame)  # BGP, BFD, ping: to the line's address
            self.counters["to_session"] += 1
            return
        if frame[0:6] != self.handoff.mac:
            self.counters["ignored_not_ours"] += 1  # another instance's, flooded on the segment
            return
        assert self.inst is not None
        buf = bytearray(frame[14:])
        with self.inst.lock:
            v = self.table.inbound(vlan, buf, time.time())
        if v is not None and v.direction == "out":  # an answer (ICMP) to the router the packet came from
            self.handoff.send(vlan, frame[6:12], ETH_IP, bytes(buf))
        elif v is not None:
            self.inst.packets.deliver(v, buf)

    # --- the sessions ---------------------------------------------------------------------------------------
    def control_loop(self) -> None:
        while True:
            self.changed.wait(POLL_S)
            self.changed.clear()
            try:
                self.reconcile()
                self.poll()
                self.report()
            except Exception as e:
                self.counters["control_errors"] += 1
                log.warning("private lines: %s", e)

    def reconcile(self) -> None:
        wanted = dict(self.wanted)
        for key in [k for k, d in self.daemons.items() if wanted.get(k) != d.spec]:
            d = self.daemons.pop(key)
            self.by_local.pop((d.spec.vlan, ip2int(d.spec.local_ip)), None)
            d.stop()
            self.session_state.pop(key, None)
        if frr_available() is not None:
            return
        for key, spec in wanted.items():
            if key in self.daemons:
                continue
            d = SessionDaemons(self.o.name, spec, self.mac, self.o.state_dir / "lines")
            try:
                d.start()
            except Exception as e:
                d.stop()
                self.session_state[key] = {"bgp_state": "Idle", "last_error": f"session did not start: {e}"}
                continue
            self.daemons[key] = d
            local = ip2int(spec.local_ip)
            self.by_local[(spec.vlan, local)] = d
            # a session moved here from a dead instance: the customer's router learns its new MAC at once
            self.handoff.send(spec.vlan, BROADCAST, ETH_ARP, arp_frame(1, self.handoff.mac, local, b"\0" * 6, local))
            threading.Thread(target=self._tap_loop, args=(d,), name=f"tap-{d.ns}", daemon=True).start()

    def _tap_loop(self, d: SessionDaemons) -> None:
        """What the session's kernel sends (ARP, BGP, BFD), out on its VLAN; ends when the session stops."""
        while d.fd is not None:
            try:
                frame = d.read()
            except OSError:
                return
            if len(frame) >= 14:
                self.handoff.send(d.spec.vlan, frame[0:6], struct.unpack_from("!H", frame, 12)[0], frame[14:])

    def poll(self) -> None:
        assert self.inst is not None
        for key, d in list(self.daemons.items()):
            st = d.state()
            prefixes = d.learned() if st["bgp_state"] == "Established" else []
            self.session_state[key] = st | {"prefixes": prefixes}
            with self.inst.lock:
                self.table.set_learned(d.spec.line_id, ip2int(d.spec.local_ip),
                                       frozenset(prefix_of(p) for p in prefixes))

    def report(self) -> None:
        """Each line's sessions here to the controller, when they changed or every REPORT_EVERY_S."""
        assert self.inst is not None
        now = time.monotonic()
        lines: dict[str, list[dict]] = {}
        for (lid, local), spec in self.wanted.items():
            st = self.session_state.get((lid, local), {"bgp_state": "Idle"})
            lines.setdefault(lid, []).append({"local_ip": spec.local_ip} | st)
        for lid in [x for x in self.reported if x not in lines]:  # no session of it here any more: say so once
            lines[lid] = []
        for lid, sessions in lines.items():
            body = {"sessions": sessions}
            last = self.reported.get(lid)
            if last is not None and last[0] == body and now - last[1] < REPORT_EVERY_S:
                continue
            try:
                self.inst.api.call("PUT", f"/v1/gateways/{self.o.name}/private-lines/{lid}", body)
                self.reported[lid] = (body, now)
                if not sessions:
                    del self.reported[lid]
            except SouthboundError as e:
                if e.status == 404:  # the line was deleted: nothing to report
                    self.reported.pop(lid, None)
                    continue
                self.counters["report_errors"] += 1
                log.warning("private line %s: report: %s", lid, e)
            except Exception as e:
                self.counters["report_errors"] += 1
                log.warning("private line %s: report: %s", lid, e)

    def close(self) -> None:
        for d in self.daemons.values():
            d.stop()
        self.daemons.clear()

    def status(self) -> dict:
        lines = []
        for x in (x for v in self.served.values() for x in v):
            sessions = [{"local_ip": s.local_ip, "customer_ip": s.customer_ip}
                        | {k: v for k, v in self.session_state.get((x.id, s.local_ip), {}).items() if k != "prefixes"}
                        | {"learned": self.session_state.get((x.id, s.local_ip), {}).get("prefixes", [])}
                        for s in x.sessions]
            lines.append({"id": x.id, "vlan": x.vlan_id, "vni": x.vni, "static_routes": x.static_routes,
                          "sessions": sessions, "routes": len(self.table.routes.get(x.vni, ()))})
        return {"lines": lines, "neighbours": len(self.handoff.neighbours)}


__all__ = ["LineRole", "LineStage"]
