"""Health checks of the load-balancer members on this host, from the vSwitch next to them (as ovn-controller does).

A probe leaves br-int as a packet-out straight to the member's port, from its subnet's gateway address and the
router MAC, to a source port in PROBE_PORTS; the member's answer (to the gateway address) is punted back by a flow
in PORT_SECURITY (lb_flows.probe_flows). So probes never cross the underlay, grow with the members a host holds,
and need nothing in the VM or in the instances.

  tcp          SYN; a SYN-ACK is a success (answered with RST), a RST or no answer within the timeout a failure
  http         the handshake, then `METHOD PATH HTTP/1.0`; the status line's code against `expected_codes`
  udp-connect  a datagram; ICMP port unreachable within the timeout is a failure, silence a success

`rise` successes in a row make a member ONLINE, `fall` failures OFFLINE; each transition is reported to the
controller (which takes an OFFLINE member out of the pools' tables). Pure: time comes in, frames go out through
`send`, transitions through `report`; malformed answers are ignored.
"""

from __future__ import annotations

import ipaddress
import logging
import random
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tianji.inet import checksum
from tianji.southbound import HostConfig, LbMonitorInfo

log = logging.getLogger("tianji.agent")
PROBE_PORTS = (0xF000, 0xF000)  # value/mask: source ports 61440-65535, the punt flows match these
ETH_IP, TCP, UDP, ICMP = 0x0800, 6, 17, 1
SYN, RST, PSH, ACK, FIN = 0x02, 0x04, 0x08, 0x10, 0x01


def _probe_port(ip: bytes, ihl: int) -> int | None:
    """The probe port a member's packet answers (a TCP destination port, or the source port of the UDP datagram an
    ICMP unreachable quotes) when it is one of PROBE_PORTS; None for anything else."""
    l4 = ip[ihl:]
    if ip[9] == TCP and len(l4) >= 20:
        port = struct.unpack_from("!H", l4, 2)[0]
    elif ip[9] == ICMP and l4[0] == 3 and len(l4) >= 8 + 28:
        inner = l4[8:]
        iihl = (inner[0] & 0xF) * 4
        if len(inner) < iihl + 2:
            return None
        port = struct.unpack_from("!H", inner, iihl)[0]
    else:
        return None
    return port if port & PROBE_PORTS[1] == PROBE_PORTS[0] else None


@dataclass(frozen=True)
class Target:
    member_id: str
    ip: str
    mac: str
    port: int
    ofport: int
    gateway_ip: str
    router_mac: str
    monitor: LbMonitorInfo


@dataclass
class State:
    target: Target
    status: str = "OFFLINE"  # monitored members start down until `rise` checks pass
    ok: int = 0
    bad: int = 0
    next_at: float = 0.0
    probe: dict | None = None  # the probe in flight: sport, deadline, seq, phase
    reported: str | None = None


def targets_of(cfg: HostConfig, ofports: dict[str, int]) -> dict[str, Target]:
    """Every monitored member plugged here (by member id)."""
    out = {}
    for vpc in cfg.vpcs:
        for lb in vpc.load_balancers:
            for lst in lb.listeners:
                if lst.monitor is None:
                    continue
                for b in lst.backends:
                    if b.port_id in ofports and b.member_id and b.gateway_ip:
                        out[b.member_id] = Target(b.member_id, b.ip, b.mac, b.port, ofports[b.port_id], b.gateway_ip,
                                                  vpc.router_mac, lst.monitor)
    return out


def _mac(m: str) -> bytes:
    return bytes.fromhex(m.replace(":", ""))


def _ip4(src: str, dst: str, proto: int, payload: bytes) -> bytes:
    hdr = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), random.getrandbits(16), 0x4000, 64, proto, 0,
                      ipaddress.IPv4Address(src).packed, ipaddress.IPv4Address(dst).packed)
    return hdr[:10] + struct.pack("!H", checksum(hdr)) + hdr[12:] + payload


def _l4_sum(src: str, dst: str, proto: int, seg: bytes) -> int:
    pseudo = ipaddress.IPv4Address(src).packed + ipaddress.IPv4Address(dst).packed + struct.pack("!BBH", 0, proto,
                                                                                                  len(seg))
    return checksum(pseudo + seg)


def tcp_frame(t: Target, sport: int, seq: int, ack: int, flags: int, data: bytes = b"") -> bytes:
    seg = struct.pack("!HHIIBBHHH", sport, t.port, seq, ack, 5 << 4, flags, 65535, 0, 0) + data
    seg = seg[:16] + struct.pack("!H", _l4_sum(t.gateway_ip, t.ip, TCP, seg)) + seg[18:]
    return _mac(t.mac) + _mac(t.router_mac) + struct.pack("!H", ETH_IP) + _ip4(t.gateway_ip, t.ip, TCP, seg)


def udp_frame(t: Target, sport: int) -> bytes:
    seg = struct.pack("!HHHH", sport, t.port, 8 + 6, 0) + b"health"
    seg = seg[:6] + struct.pack("!H", _l4_sum(t.gateway_ip, t.ip, UDP, seg) or 0xFFFF) + seg[8:]
    return _mac(t.mac) + _mac(t.router_mac) + struct.pack("!H", ETH_IP) + _ip4(t.gateway_ip, t.ip, UDP, seg)


def code_ok(code: int, expected: str | None) -> bool:
    """`expected_codes` as Octavia has it: 200, 200-299, 200,202 (default 200)."""
    for part in (expected or "200").split(","):
        lo, _, hi = part.partition("-")
        if int(lo) <= code <= int(hi or lo):
            return True
    return False


@dataclass
class Prober:
    send: Callable[[int, bytes], None]  # (OpenFlow port, frame)
    report: Callable[[dict[str, str]], None]  # member id -> ONLINE / OFFLINE
    states: dict[str, State] = field(default_factory=dict)

    def update(self, targets: dict[str, Target]) -> None:
        """Keep the counts of members that stay (a changed monitor or port restarts their probing)."""
        old = self.states
        self.states = {}
        for mid, t in targets.items():
            s = old.get(mid)
            self.states[mid] = s if s is not None and s.target == t else State(t)

    def run(self, sleep: Callable[[float], None]) -> None:
        """Probe for ever (the agent's green thread: `sleep` is its hub's)."""
        while True:
            self.tick(time.time())
            sleep(0.05)

    def tick(self, now: float) -> None:
        for s in self.states.values():
            if s.probe is not None and now >= s.probe["deadline"]:
                self._result(s, s.target.monitor.type == "udp-connect", now)  # silence: UDP up, else down
            if s.probe is None and now >= s.next_at:
                self._start(s, now)

    def _start(self, s: State, now: float) -> None:
        t, sport = s.target, 0xF000 | random.getrandbits(12)
        s.probe = {"sport": sport, "deadline": now + t.monitor.timeout_s, "seq": random.getrandbits(32)}
        s.next_at = now + t.monitor.interval_s
        if t.monitor.type == "udp-connect":
            self.send(t.ofport, udp_frame(t, sport))
        else:
            self.send(t.ofport, tcp_frame(t, sport, s.probe["seq"], 0, SYN))

    def _result(self, s: State, ok: bool, now: float) -> None:
        s.probe = None
        m = s.target.monitor
        if ok:
            s.ok, s.bad = s.ok + 1, 0
            if s.status != "ONLINE" and s.ok >= m.rise:
                s.status = "ONLINE"
        else:
            s.ok, s.bad = 0, s.bad + 1
            if s.status != "OFFLINE" and s.bad >= m.fall:
                s.status = "OFFLINE"
        if s.status != s.reported and (s.ok >= m.rise or s.bad >= m.fall):
            try:
                self.report({s.target.member_id: s.status})
                s.reported = s.status
                log.info("health: member %s (%s:%d) is %s", s.target.member_id, s.target.ip, s.target.port, s.status)
            except Exception:  # the controller is away: the next result reports again
                s.reported = None

    def on_packet(self, in_port: int, frame: bytes, now: float) -> bool:
        """A punted answer to a probe (TCP to a probe port, or ICMP unreachable about a probe's datagram); False
        for anything else the member's port punts (DHCP, DNS to its resolver, time exceeded): the caller's."""
        if len(frame) < 34 or struct.unpack_from("!H", frame, 12)[0] != ETH_IP:
            return False
        ip = frame[14:]
        ihl = (ip[0] & 0xF) * 4
        if len(ip) < ihl + 8 or (probe_port := _probe_port(ip, ihl)) is None:
            return False
        src = str(ipaddress.IPv4Address(ip[12:16]))
        s = next((x for x in self.states.values() if x.target.ip == src and x.target.ofport == in_port), None)
        if s is None or s.probe is None or probe_port != s.probe["sport"]:
            return s is not None  # a late answer to an ended probe: nobody else's
        if ip[9] == ICMP:
            self._result(s, False, now)
        else:
            self._tcp(s, ip[ihl:], now)
        return True

    def _tcp(self, s: State, l4: bytes, now: float) -> None:
        t, p = s.target, s.probe
        assert p is not None
        seq, ack = struct.unpack_from("!II", l4, 4)
        flags, data = l4[13], l4[(l4[12] >> 4) * 4:]
        if flags & RST:
            self._result(s, False, now)
        elif flags & SYN and flags & ACK and ack == (p["seq"] + 1) & 0xFFFFFFFF:
            if t.monitor.type == "tcp":
                self.send(t.ofport, tcp_frame(t, p["sport"], ack, 0, RST))
                self._result(s, True, now)
            else:
                req = f"{t.monitor.http_method or 'GET'} {t.monitor.url_path or '/'} HTTP/1.0\r\n" \
                      f"Host: {t.ip}\r\nUser-Agent: tianji-health\r\n\r\n".encode()
                p["next"] = (ack, (seq + 1) & 0xFFFFFFFF)
                self.send(t.ofport, tcp_frame(t, p["sport"], ack, (seq + 1) & 0xFFFFFFFF, PSH | ACK, req))
        elif data and "next" in p:
            line = data.split(b"\r\n", 1)[0].split()
            ok = len(line) >= 2 and line[0].startswith(b"HTTP/") and line[1].isdigit() and \
                code_ok(int(line[1]), t.monitor.expected_codes)
            self.send(t.ofport, tcp_frame(t, p["sport"], ack, 0, RST))
            self._result(s, ok, now)
