"""A live trace (controller/reachability/live.py): the controller's question about one packet, asked of this
host's Open vSwitch with `ovs-appctl ofproto/trace`, conntrack taken as a new connection at each pass (the
question is about a connection's first packet). The answer is what it printed; the controller reads it."""

from __future__ import annotations

import glob
import json
import os
import subprocess
from typing import Any

PROTOS = {6: "tcp", 17: "udp", 1: "icmp"}
CT_PASSES = 4  # a packet meets conntrack at most twice on one switch (egress, ingress); more is harmless


def flow_spec(in_port: int, pkt: dict[str, Any]) -> str:
    """ofproto/trace's flow syntax for the packet the model sent (tianji's field names, vswitch_agent.ofmodel)."""
    if int(pkt.get("eth_type", 0x0800)) == 0x0806:
        return ",".join([f"in_port={in_port}", "arp", f"dl_src={pkt['eth_src']}", f"dl_dst={pkt['eth_dst']}",
                         f"arp_op={int(pkt['arp_op'])}", f"arp_spa={pkt['arp_spa']}", f"arp_tpa={pkt['arp_tpa']}",
                         f"arp_sha={pkt['arp_sha']}", f"arp_tha={pkt['arp_tha']}"])
    if int(pkt.get("eth_type", 0x0800)) == 0x86DD:
        return _spec6(in_port, pkt)
    proto = PROTOS.get(int(pkt.get("ip_proto", 0)), "ip")
    parts = [f"in_port={in_port}", proto, f"dl_src={pkt['eth_src']}", f"dl_dst={pkt['eth_dst']}",
             f"nw_src={pkt['ipv4_src']}", f"nw_dst={pkt['ipv4_dst']}", f"nw_ttl={int(pkt.get('ttl', 64))}"]
    if proto in ("tcp", "udp"):
        parts += [f"tp_src={int(pkt[f'{proto}_src'])}", f"tp_dst={int(pkt[f'{proto}_dst'])}"]
    elif proto == "icmp":
        parts += [f"icmp_type={int(pkt.get('icmp_type', 8))}", f"icmp_code={int(pkt.get('icmp_code', 0))}"]
    return ",".join(parts)


def _spec6(in_port: int, pkt: dict[str, Any]) -> str:
    """An IPv6 packet (a neighbour solicitation, or a VM's packet) in ofproto/trace's syntax."""
    proto = {6: "tcp6", 17: "udp6", 58: "icmp6"}.get(int(pkt.get("ip_proto", 0)), "ipv6")
    parts = [f"in_port={in_port}", proto, f"dl_src={pkt['eth_src']}", f"dl_dst={pkt['eth_dst']}",
             f"ipv6_src={pkt['ipv6_src']}", f"ipv6_dst={pkt['ipv6_dst']}", f"nw_ttl={int(pkt.get('ttl', 64))}"]
    if proto in ("tcp6", "udp6"):
        p = proto[:3]
        parts += [f"tp_src={int(pkt[f'{p}_src'])}", f"tp_dst={int(pkt[f'{p}_dst'])}"]
    elif proto == "icmp6":
        parts += [f"icmpv6_type={int(pkt.get('icmpv6_type', 128))}", f"icmpv6_code={int(pkt.get('icmpv6_code', 0))}"]
        if "ipv6_nd_target" in pkt:
            parts += [f"nd_target={pkt['ipv6_nd_target']}", f"nd_sll={pkt.get('ipv6_nd_sll', '00:00:00:00:00:00')}"]
    return ",".join(parts)


def appctl_target(rundir: str | None) -> list[str]:
    """`-t` for a private Open vSwitch's ovs-vswitchd (its run directory), none for the system's."""
    if not rundir:
        return []
    ctls = sorted(glob.glob(os.path.join(rundir, "ovs-vswitchd.*.ctl")), key=os.path.getmtime)
    return ["-t", ctls[-1]] if ctls else []


def trace(rundir: str | None, in_port: int, pkt: dict[str, Any], bridge: str = "br-int") -> str:
    cmd = ["ovs-appctl", *appctl_target(rundir), "ofproto/trace", bridge, flow_spec(in_port, pkt)]
    for _ in range(CT_PASSES):
        cmd += ["--ct-next", "trk,new"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    if r.returncode != 0:
        raise RuntimeError(f"ovs-appctl ofproto/trace: {r.stderr.strip()[:500]}")
    return r.stdout


def answer(data: str, ofports: dict[str, int], rundir: str | None) -> tuple[str | None, dict[str, Any]]:
    """(the question's id, what to answer) for a `trace` event's data; a bad question or a failed trace is
    answered as an error, never raised (into the stream that brought it)."""
    try:
        q = json.loads(data)
        ident = str(q["id"])
    except (ValueError, KeyError, TypeError):
        return None, {}
    try:
        of = ofports.get(q["port_id"])
        if of is None:
            return ident, {"error": f"port {q['port_id']} is not plugged on this switch"}
        return ident, {"output": trace(rundir, of, q["packet"]), "ofports": ofports}
    except Exception as e:
        return ident, {"error": f"{type(e).__name__}: {e}"[:2000]}
