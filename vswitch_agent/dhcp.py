"""The DHCP responder: a pure function from a client's DISCOVER/REQUEST to the switch's OFFER/ACK."""

from __future__ import annotations

import ipaddress
import logging

from os_ken.lib.packet import dhcp, ethernet, ipv4, packet, udp

log = logging.getLogger(__name__)
LEASE_SECONDS = 86400
REPLY_TYPE = {dhcp.DHCP_DISCOVER: dhcp.DHCP_OFFER, dhcp.DHCP_REQUEST: dhcp.DHCP_ACK}


def _opt(tag: int, value: bytes) -> dhcp.option:
    return dhcp.option(tag=tag, value=value)


def reply(frame: bytes, *, ip: str, cidr: str, gateway_ip: str, router_mac: str, mtu: int) -> bytes | None:
    """The reply for `frame`, or None when it is not a DHCP DISCOVER/REQUEST (or cannot be parsed)."""
    try:
        pkt = packet.Packet(frame)
        eth = pkt.get_protocol(ethernet.ethernet)
        req = pkt.get_protocol(dhcp.dhcp)
    except Exception as e:  # a malformed packet must never crash the agent
        log.debug("unparsable DHCP packet-in: %s", e)
        return None
    if eth is None or req is None or req.op != dhcp.DHCP_BOOT_REQUEST:
        return None
    msg_type = None
    for o in (req.options.option_list if req.options else []):
        if o.tag == dhcp.DHCP_MESSAGE_TYPE_OPT and o.value:
            msg_type = o.value[0]
    if msg_type not in REPLY_TYPE:
        return None
    net = ipaddress.IPv4Network(cidr)
    opts = dhcp.options(option_list=[
        _opt(dhcp.DHCP_MESSAGE_TYPE_OPT, bytes([REPLY_TYPE[msg_type]])),
        _opt(dhcp.DHCP_SERVER_IDENTIFIER_OPT, ipaddress.IPv4Address(gateway_ip).packed),
        _opt(dhcp.DHCP_IP_ADDR_LEASE_TIME_OPT, LEASE_SECONDS.to_bytes(4, "big")),
        _opt(dhcp.DHCP_SUBNET_MASK_OPT, net.netmask.packed),
        _opt(dhcp.DHCP_GATEWAY_ADDR_OPT, ipaddress.IPv4Address(gateway_ip).packed),
        _opt(6, ipaddress.IPv4Address(gateway_ip).packed),  # DNS server: the VPC's resolver at the gateway (dns.py)
        _opt(26, mtu.to_bytes(2, "big")),  # interface MTU
        _opt(28, net.broadcast_address.packed),  # broadcast address
    ])
    resp = dhcp.dhcp(op=dhcp.DHCP_BOOT_REPLY, chaddr=req.chaddr, hlen=6, xid=req.xid, flags=req.flags,
                     yiaddr=ip, siaddr=gateway_ip, giaddr=req.giaddr, options=opts)
    out = packet.Packet()
    out.add_protocol(ethernet.ethernet(dst=eth.src, src=router_mac, ethertype=0x0800))
    out.add_protocol(ipv4.ipv4(src=gateway_ip, dst=ip, proto=17, ttl=64))
    out.add_protocol(udp.udp(src_port=67, dst_port=68))
    out.add_protocol(resp)
    out.serialize()
    return bytes(out.data)
