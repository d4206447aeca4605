"""The ceiling of OVS's userspace datapath on this machine, for bench/cluster.py: two namespaces as hypervisors,
each with its own OVS, joined by a veth underlay, AF_XDP ports, one "VM" each, and no Tianji at all. The
pipeline is either NORMAL with the VNI set by one flow ("bare"), or that plus one conntrack pass per host with a
commit of new connections ("ct"), the least that stateful security groups need. Tianji's pipeline does the same
datapath work per packet (a `ct()` and a recirculation per host, a tunnel pop and push), so these rows say how much of
what the datapath can carry the rest of the system leaves on the table."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from topologies import netns
from topologies.machines import ovs_env, ovs_pids, sh, start_private_ovs

VNI = 5001
T = TypeVar("T")
FLOWS = {
    "bare": ["in_port={vm},actions=set_field:{vni}->tun_id,normal", "in_port=vxlan0,tun_id={vni},actions=normal"],
    "ct": ["table=0,ip,actions=ct(table=1,zone=1)", "table=0,priority=0,actions=goto_table:1",
           "table=1,ip,ct_state=+trk+new,in_port={vm},actions=ct(commit,zone=1),set_field:{vni}->tun_id,normal",
           "table=1,ip,ct_state=+trk+new,in_port=vxlan0,actions=ct(commit,zone=1),normal",
           "table=1,priority=0,in_port={vm},actions=set_field:{vni}->tun_id,normal",
           "table=1,priority=0,in_port=vxlan0,actions=normal"],
}


def on_bare_ovs(mtu: int, pipeline: str, measure: Callable[[str, str, str], T]) -> T:
    """`measure(client_ns, server_ns, server_ip)` from VM 1 to VM 2 over the two-OVS overlay at VM MTU `mtu`,
    AF_XDP on every port, `pipeline` one of FLOWS."""
    tag = "tjob"
    hv, vm = [f"{tag}h{i}" for i in (1, 2)], [f"{tag}v{i}" for i in (1, 2)]
    base = Path(tempfile.mkdtemp(prefix="tianji-ovs-baseline-"))
    try:
        for n in hv + vm:
            netns.add(n)
        netns.veth("ul0", hv[0], "ul0", hv[1], up=False)
        for i, (h, v) in enumerate(zip(hv, vm, strict=True), start=1):
            run = base / h
            start_private_ovs(h, run)
            env = ovs_env(run)

            def vsctl(*a: str, h: str = h, env: dict = env, run: Path = run) -> None:
                sh("ovs-vsctl", f"--db=unix:{run}/db.sock", *a, ns=h, env=env)

            sh("ip", "link", "set", "ul0", "mtu", str(mtu + 50), "up", ns=h)
            vsctl("add-br", "br-phy", "--", "set", "bridge", "br-phy", "datapath_type=netdev",
                  f"other_config:hwaddr=02:00:00:00:0{i}:fe", "--", "add-port", "br-phy", "ul0", "--",
                  "set", "interface", "ul0", "type=afxdp-nonpmd", f"mtu_request={mtu + 50}", "--",
                  "set", "interface", "br-phy", f"mtu_request={mtu + 50}")
            sh("ip", "addr", "add", f"172.31.9.{i}/24", "dev", "br-phy", ns=h)
            sh("ip", "link", "set", "br-phy", "up", ns=h)
            netns.veth("eth0", v, "vm0", h, up=False)
            sh("ip", "link", "set", "vm0", "mtu", str(mtu), "up", ns=h)
            vsctl("add-br", "br-int", "--", "set", "bridge", "br-int", "datapath_type=netdev", "--",
                  "add-port", "br-int", "vxlan0", "--", "set", "interface", "vxlan0", "type=vxlan",
                  f"options:remote_ip=172.31.9.{3 - i}", f"options:local_ip=172.31.9.{i}", "options:key=flow",
                  "--", "add-port", "br-int", "vm0", "--", "set", "interface", "vm0", "type=afxdp-nonpmd",
                  f"mtu_request={mtu}")
            sh("ip", "addr", "add", f"10.99.0.{i}/24", "dev", "eth0", ns=v)
            sh("ip", "link", "set", "eth0", "mtu", str(mtu), "up", ns=v)
            sh("ethtool", "-K", "eth0", "tx", "off", ns=v)  # full checksums: AF_XDP cannot complete partial ones
            sh("ovs-ofctl", "del-flows", "br-int", ns=h, env=env)
            for f in FLOWS[pipeline]:
                sh("ovs-ofctl", "add-flow", "br-int", f.format(vm="vm0", vni=VNI), ns=h, env=env)
        sh("ping", "-c", "3", "-W", "2", "10.99.0.2", ns=vm[0], check=False)
        return measure(vm[0], vm[1], "10.99.0.2")
    finally:
        for h in hv:
            for pid in ovs_pids(base / h):
                sh("kill", str(pid), check=False)
        netns.delete(vm + hv)
        shutil.rmtree(base, ignore_errors=True)
