"""The agent's host: its options, the local state that must survive a restart (conntrack zones per VPC), and the
bridges and VTEP address it sets up on Open vSwitch before it programs anything."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from tianji.southbound import vtep_interface
from tianji.tls import ClientTls
from vswitch_agent.ovsdb import Ovsdb


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
    port_type: str = "auto"  # the underlay NIC's OVS port: auto (AF_XDP if it works), afxdp or system
    underlay_port_type: str = ""  # what setup_host chose
    state_dir: Path = field(default_factory=lambda: Path("/run/tianji"))
    audit_interval: float = 2.0  # shortest time for a whole audit sweep (small hosts)
    # the audit yields to changes: no chunk (a walk of every flow in the switch, which a change would queue behind)
    # within audit_quiet seconds of a change, but it never waits more than audit_max_defer seconds
    audit_quiet: float = 0.5
    audit_max_defer: float = 5.0
    audit_rate: float = 500_000.0  # flows the switch walks per second for the audit, after a connection's first sweep
    heartbeat_interval: float = 2.0
    dns_forwarder: tuple[str, int] | None = None  # the operator's resolver, for names outside the VPCs' zone
    tls: ClientTls | None = None  # how the controller is verified, and this host's certificate
    metrics_port: int | None = None  # Prometheus metrics over HTTP (None: not served)
    metrics_address: str = "127.0.0.1"

    @property
    def vtep_addr(self) -> str:
        return str(vtep_interface(self.vtep_ip).ip)


def status_path(state_dir: Path, host: str) -> Path:
    return state_dir / f"agent-{host}.json"


class ZoneMap:
    """Conntrack zones are 16 bits and VNIs 24: each VPC with ports here gets a zone of its own, kept in a file
    so a restarted agent computes the same flows (and established connections keep their state). Only the VPCs
    that have ports here now are kept."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.zones: dict[str, int] = json.loads(path.read_text())
        except (OSError, ValueError):
            self.zones = {}
        self.saved = dict(self.zones)  # what the file holds: written only when the map changes
        self._last: tuple[frozenset, dict[str, int]] | None = None

    def assign(self, vpc_ids: set[str], vnis: dict[str, int]) -> dict[str, int]:
        key = frozenset(vpc_ids)
        if self._last is not None and self._last[0] == key:
            return self._last[1]
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
            result[vid] = z
            taken.add(z)
        # only the VPCs with ports here: one that left took its connections with it, and every VPC that ever had a
        # port here, kept, made the map (and the file written at each change) grow with tenants' churn
        self.zones = dict(result)
        if self.zones != self.saved or not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.zones))
            self.saved = dict(self.zones)
        self._last = (key, result)
        return result


def setup_host(o: AgentOptions) -> None:
    """OVSDB bridges and the VTEP address on br-phy (idempotent)."""
    from pyroute2 import IPRoute

    ovsdb = Ovsdb(o.ovs_rundir)
    ovsdb.ensure_bridges(datapath=o.datapath, of_port=o.of_port, underlay_if=o.underlay_if, vtep_ip=o.vtep_addr)
    iface = vtep_interface(o.vtep_ip)
    with IPRoute() as ipr:
        nic = ipr.link_lookup(ifname=o.underlay_if)
        mtu = ipr.get_links(nic[0])[0].get_attr("IFLA_MTU") if nic else 1500
    o.underlay_port_type = ovsdb.underlay(o.underlay_if, mtu, o.port_type) if o.datapath == "netdev" else "system"
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
