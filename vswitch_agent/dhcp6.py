"""The DHCPv6 server of a DHCPv6-stateful subnet (RFC 8415), in the agent: a pure function from a client's
message to the router's answer, giving the port the address the API shows (one IA_NA address). Solicit gets an
Advertise (a Reply with Rapid Commit when asked), Request, Renew, Rebind and Confirm a Reply; Release and
Information-request a Reply with no address. Anything else, or a frame that does not parse: None."""

from __future__ import annotations

import ipaddress
import struct

from tianji.inet import link_local
from vswitch_agent.icmp6 import ETH_IPV6, frame, mac_bytes

UDP = 17
CLIENT_PORT, SERVER_PORT = 546, 547
SOLICIT, ADVERTISE, REQUEST, CONFIRM, RENEW, REBIND, REPLY, RELEASE, INFO_REQUEST = 1, 2, 3, 4, 5, 6, 7, 8, 11
CLIENTID, SERVERID, IA_NA, IAADDR, STATUS_CODE, RAPID_COMMIT = 1, 2, 3, 5, 13, 14
PREFERRED_S, VALID_S = 86400, 172800
T1_S, T2_S = PREFERRED_S // 2, PREFERRED_S * 4 // 5
ANSWERS = {SOLICIT: ADVERTISE, REQUEST: REPLY, CONFIRM: REPLY, RENEW: REPLY, REBIND: REPLY, RELEASE: REPLY,
           INFO_REQUEST: REPLY}


def duid(router_mac: str) -> bytes:
    """The server's DUID: DUID-LL (type 3) of the router MAC, the same on every host of the VPC."""
    return struct.pack("!HH", 3, 1) + mac_bytes(router_mac)


def options(data: bytes) -> dict[int, bytes] | None:
    """A message's options (the first of each code), or None when they do not parse."""
    out: dict[int, bytes] = {}
    at = 0
    while at < len(data):
        if at + 4 > len(data):
            return None
        code, length = struct.unpack_from("!HH", data, at)
        if at + 4 + length > len(data):
            return None
        out.setdefault(code, data[at + 4:at + 4 + length])
        at += 4 + length
    return out


def _opt(code: int, value: bytes) -> bytes:
    return struct.pack("!HH", code, len(value)) + value


def parse(data: bytes) -> tuple[bytes, ipaddress.IPv6Address, int, bytes, dict[int, bytes]] | None:
    """(source MAC, source address, message type, transaction id, options) of a client's message, or None."""
    if len(data) < 66 or struct.unpack_from("!H", data, 12)[0] != ETH_IPV6 or data[14] >> 4 != 6 or data[20] != UDP:
        return None
    sport, dport, ulen = struct.unpack_from("!HHH", data, 54)
    if (sport, dport) != (CLIENT_PORT, SERVER_PORT) or ulen < 12 or 54 + ulen > len(data):
        return None
    msg = data[62:54 + ulen]
    opts = options(msg[4:])
    return None if opts is None else (data[6:12], ipaddress.IPv6Address(data[22:38]), msg[0], msg[1:4], opts)


def reply(data: bytes, *, address: str, router_mac: str) -> bytes | None:
    """The router's answer to a client's message, or None."""
    got = parse(data)
    if got is None:
        return None
    src_mac, src, kind, xid, opts = got
    server = duid(router_mac)
    if kind not in ANSWERS or CLIENTID not in opts and kind != INFO_REQUEST:
        return None
    if kind in (REQUEST, RENEW, RELEASE) and opts.get(SERVERID) != server:
        return None  # meant for another server (RFC 8415, 16.4)
    if kind in (SOLICIT, CONFIRM, REBIND, INFO_REQUEST) and SERVERID in opts:
        return None  # these never name a server
    answer = REPLY if kind == SOLICIT and RAPID_COMMIT in opts else ANSWERS[kind]
    out = _opt(SERVERID, server) + (_opt(CLIENTID, opts[CLIENTID]) if CLIENTID in opts else b"")
    if kind == SOLICIT and answer == REPLY:
        out += _opt(RAPID_COMMIT, b"")
    if kind in (SOLICIT, REQUEST, RENEW, REBIND) and IA_NA in opts and len(opts[IA_NA]) >= 12:
        iaid = opts[IA_NA][:4]
        addr = _opt(IAADDR, ipaddress.IPv6Address(address).packed + struct.pack("!II", PREFERRED_S, VALID_S))
        out += _opt(IA_NA, iaid + struct.pack("!II", T1_S, T2_S) + addr)
    elif kind in (CONFIRM, RELEASE):
        out += _opt(STATUS_CODE, struct.pack("!H", 0) + b"ok")
    payload = bytes([answer]) + xid + out
    udp = struct.pack("!HHHH", SERVER_PORT, CLIENT_PORT, 8 + len(payload), 0) + payload
    return frame(mac_bytes(router_mac), src_mac, link_local(router_mac), src, UDP, udp, 64)
