"""A private line on the wire, packets/s both ways, against Open vSwitch doing the same job in the same run.

Three namespaces: `c` (a hypervisor stand-in: sends VXLAN, counts what comes back in VXLAN), `g` (the gateway)
and `s` (the customer's side of the handoff: sends tagged frames, counts what arrives tagged):

    c.ul0 (VTEP 172.30.0.2) -- g.ul0 (VTEP 172.30.0.1) | g.ho0 -- s.eth0 (VLAN 100, router 169.254.10.2)

  tianji  `tianji gateway run --role private-line` in g (its native stage), from a config file: VNI 1001 <->
          VLAN 100, the site's 192.168.20.0/24 a static route of the line
  ovs     a netdev bridge in g (AF_XDP ports, the br-phy pattern for VXLAN) with the same job in flows:
          tun_id=1001 -> push_vlan 100, the router's MAC, out ho0; dl_vlan=100 -> pop_vlan, dec_ttl, the VM's MAC,
          tun_id=1001, out vxlan0 (this kernel cannot tag: OVS pushes and pops itself, as tianji does)

64-byte inner frames from the same generator (bench/native/blast.c, on the first core). The gateway gets the other
core, whole (`napi`, the default): its threads (tianji's loop, OVS's), and its veth ends' receive work, in NAPI
threads of their own there (GRO on gives a veth a NAPI; `threaded` moves it to a kthread, pinned), as a NIC's
receive runs on the gateway host's cores. So a native XDP program (OVS's AF_XDP ports, DPDK's, ours in driver mode)
and tianji's XDP flow cache in generic mode (the ports' RPS on the loop's core) run on the gateway's core, not in
the generator's context, where a veth runs its peer's receive by default (`napi=False`: the sender then pays the
gateway's XDP and AF_XDP copies, and neither side's cost is measured alone). Where the generator cannot offer what
the gateway could carry, the gateway core's load over the run (/proc/stat) gives its capacity: what it carried over
that share of the core.
`out`: VXLAN -> VLAN, counted at s by an nftables ingress rule that matches VLAN 100
and the site's prefix; `in`: VLAN -> VXLAN, counted at c by one that matches VXLAN from g's VTEP.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.native_tools import compiled
from topologies import netns
from topologies.hosts import read_status
from topologies.machines import GatewayHost, ovs_env, ovs_pids, sh, start_private_ovs

C, G, S = "tjlwc", "tjlwg", "tjlws"
VNI, VLAN = 1001, 100
C_VTEP, G_VTEP = "172.30.0.2", "172.30.0.1"
VM_IP, VM_MAC, ROUTER_MAC = "10.0.1.5", "02:00:00:00:01:05", "02:00:00:00:01:01"
G_HO_MAC, SITE_MAC, SITE_IP, LOCAL_IP = "02:00:00:00:0a:01", "02:00:00:00:0a:02", "169.254.10.2", "169.254.10.1"
SITE_HOST = "192.168.20.7"
TIANJI = str(Path(sys.executable).with_name("tianji"))


def mac_of(ns: str, dev: str) -> str:
    return json.loads(sh("ip", "-n", ns, "-j", "link", "show", "dev", dev).stdout)[0]["address"]


def plumb() -> None:
    down()
    for n in (C, G, S):
        netns.add(n)
    netns.veth("ul0", C, "ul0", G, full_checksums=True)
    netns.veth("ho0", G, "eth0", S, full_checksums=True)
    sh("ip", "-n", G, "link", "set", "ho0", "address", G_HO_MAC)
    sh("ip", "-n", S, "link", "set", "eth0", "address", SITE_MAC)
    netns.address(C, "ul0", f"{C_VTEP}/24")
    for ns, dev in ((G, "ho0"), (S, "eth0")):  # tags stay in the frames: AF_XDP cannot read them from metadata
        sh("ip", "netns", "exec", ns, "ethtool", "-K", dev, "rxvlan", "off", "txvlan", "off", check=False)
    counters()


def counters() -> None:
    """What each side counts (and drops before its kernel answers it)."""
    for ns, dev, match in ((S, "eth0", f"vlan id {VLAN} ip daddr 192.168.20.0/24"),
                           (C, "ul0", f"ip saddr {G_VTEP} udp dport 4789")):
        for cmd in ("add table netdev bench", f"add chain netdev bench in {{ type filter hook ingress device {dev} "
                    "priority 0 ; }", f"add rule netdev bench in {match} counter drop"):
            sh("ip", "netns", "exec", ns, "nft", cmd)


def count(ns: str) -> int:
    r = sh("ip", "netns", "exec", ns, "nft", "list", "chain", "netdev", "bench", "in")
    return int(r.stdout.split("counter packets ")[1].split()[0])


def down() -> None:
    for n in (C, G, S):
        sh("ip", "netns", "del", n, check=False)


def frames(direction: str, flows: int, path: Path) -> Path:
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Dot1Q, Ether

    out = bytearray()
    for i in range(flows):
        if direction == "out":
            inner = (Ether(src=VM_MAC, dst=ROUTER_MAC) / IP(src=VM_IP, dst=SITE_HOST) / UDP(sport=10000 + i, dport=9)
                     / (b"\0" * 18))
            f = bytes(Ether(src=mac_of(C, "ul0"), dst=mac_of(G, "ul0")) / IP(src=C_VTEP, dst=G_VTEP)
                      / UDP(sport=49152 + i % 16384, dport=4789)
                      / (b"\x08\0\0\0" + VNI.to_bytes(3, "big") + b"\0" + bytes(inner)))
        else:
            f = bytes(Ether(src=SITE_MAC, dst=G_HO_MAC) / Dot1Q(vlan=VLAN) / IP(src=SITE_HOST, dst=VM_IP)
                      / UDP(sport=10000 + i, dport=9) / (b"\0" * 18))
        out += len(f).to_bytes(2, "big") + f
    path.write_bytes(bytes(out))
    return path


def site_arp() -> None:
    """The site's router announces itself on its VLAN (the gateway learns its MAC from ARP)."""
    from scapy.layers.l2 import ARP, Dot1Q, Ether

    f = Ether(src=SITE_MAC, dst="ff:ff:ff:ff:ff:ff") / Dot1Q(vlan=VLAN) / ARP(op=1, hwsrc=SITE_MAC, psrc=SITE_IP,
                                                                             pdst=LOCAL_IP)
    prog = f"import socket; s=socket.socket(socket.AF_PACKET, socket.SOCK_RAW); s.bind(('eth0', 0)); " \
           f"s.send(bytes.fromhex('{bytes(f).hex()}'))"
    sh("ip", "netns", "exec", S, sys.executable, "-c", prog)


def tianji(workdir: Path, fastpath: str = "auto") -> subprocess.Popen:
    ep = {"port_id": "p1", "vpc_id": "v1", "vni": VNI, "ip": VM_IP, "mac": VM_MAC, "host": "hv", "vtep_ip": C_VTEP}
    line = {"id": "line-1", "vni": VNI, "vlan_id": VLAN, "local_asn": 64512, "customer_asn": 65010,
            "vpc_cidr": "10.0.0.0/16", "static_routes": ["192.168.20.0/24"],
            "sessions": [{"local_ip": f"{LOCAL_IP}/30", "customer_ip": f"{SITE_IP}/30", "prefixlen": 30}]}
    cfg = {"name": "lw", "revision": 1, "vtep_ip": G_VTEP, "endpoints": [ep], "lines": [line],
           "vpcs": [{"id": "v1", "vni": VNI, "router_mac": ROUTER_MAC}], "vteps": [{"host": "hv", "ip": C_VTEP}]}
    (workdir / "config.json").write_text(json.dumps(cfg))
    netns.address(G, "ul0", f"{G_VTEP}/24")
    host = GatewayHost("lw", G, f"{G_VTEP}/24", "private-line")
    cmd = ["ip", "netns", "exec", G, *host.command(TIANJI, ["--config-file", str(workdir / "config.json")], workdir,
                                                   "--fastpath", fastpath)]
    proc = subprocess.Popen(cmd, stdout=open(workdir / "gateway.log", "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.time() + 30
    while read_status(workdir / "gateway-lw.json").get("revision") != 1:
        if time.time() > deadline or proc.poll() is not None:
            raise RuntimeError(f"the gateway did not start: {(workdir / 'gateway.log').read_text()[-2000:]}")
        time.sleep(0.2)
    return proc


def gateway_core() -> int:
    """The gateway's core (the last one this process may use: the instance's loop takes it), the generator's is the
    first."""
    return max(os.sched_getaffinity(0))


def cpu_times(core: int) -> tuple[int, int, int]:
    """The core's (busy, user, total) jiffies so far: busy is user, system, softirq... against idle and iowait."""
    fields = next(line.split() for line in Path("/proc/stat").read_text().splitlines()
                  if line.startswith(f"cpu{core} "))
    ticks = [int(x) for x in fields[1:9]]
    return sum(ticks) - ticks[3] - ticks[4], ticks[0] + ticks[1], sum(ticks)


def napi_on_the_gateway_core() -> None:
    """The gateway's veth ends receive in a NAPI thread of their own on the gateway core (GRO on gives a veth NAPI):
    a native XDP program there (OVS's, DPDK's, ours in driver mode) runs on the gateway's core, not in the
    generator's context."""
    core = gateway_core()
    before = set(napi_threads())
    for dev in ("ul0", "ho0"):
        sh("ip", "netns", "exec", G, "ethtool", "-K", dev, "gro", "on", check=False)
        sh("ip", "netns", "exec", G, "sh", "-c", f"echo 1 > /sys/class/net/{dev}/threaded")
    for pid in set(napi_threads()) - before:
        sh("taskset", "-p", f"{1 << core:x}", str(pid))


def napi_threads() -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and (p / "comm").read_text().startswith("napi/"):
                pids.append(int(p.name))
        except OSError:  # gone meanwhile
            continue
    return pids


def ovs_on_the_gateway_core(workdir: Path) -> None:
    """OVS's threads on the gateway core, as the instance's loop is (the generator's core left to it)."""
    for pid in ovs_pids(workdir):
        sh("taskset", "-a", "-p", f"{1 << gateway_core():x}", str(pid))


def ovs(workdir: Path, mode: str = "native") -> None:
    start_private_ovs(G, workdir)
    env = ovs_env(workdir)

    def vsctl(*a: str) -> None:
        sh("ovs-vsctl", f"--db=unix:{workdir}/db.sock", *a, ns=G, env=env)

    vsctl("add-br", "br-phy", "--", "set", "bridge", "br-phy", "datapath_type=netdev",
          f"other_config:hwaddr={mac_of(G, 'ul0')}", "--", "add-port", "br-phy", "ul0", "--",
          "set", "interface", "ul0", "type=afxdp-nonpmd", f"options:xdp-mode={mode}")
    sh("ip", "addr", "add", f"{G_VTEP}/24", "dev", "br-phy", ns=G)
    sh("ip", "link", "set", "br-phy", "up", ns=G)
    vsctl("add-br", "br-int", "--", "set", "bridge", "br-int", "datapath_type=netdev",
          "protocols=OpenFlow10,OpenFlow13", "--",
          "add-port", "br-int", "vxlan0", "--", "set", "interface", "vxlan0", "type=vxlan",
          f"options:remote_ip={C_VTEP}", f"options:local_ip={G_VTEP}", "options:key=flow", "--",
          "add-port", "br-int", "ho0", "--", "set", "interface", "ho0", "type=afxdp-nonpmd", f"options:xdp-mode={mode}")
    flows = [f"in_port=vxlan0,tun_id={VNI},ip,nw_dst=192.168.20.0/24,actions=push_vlan:0x8100,"
             f"set_field:{4096 + VLAN}->vlan_vid,mod_dl_src:{G_HO_MAC},mod_dl_dst:{SITE_MAC},output:ho0",
             f"in_port=ho0,dl_vlan={VLAN},ip,nw_dst=10.0.0.0/16,actions=pop_vlan,dec_ttl,mod_dl_src:{ROUTER_MAC},"
             f"mod_dl_dst:{VM_MAC},set_field:{VNI}->tun_id,output:vxlan0"]
    sh("ovs-ofctl", "-O", "OpenFlow13", "del-flows", "br-int", ns=G, env=env)
    for f in flows:
        sh("ovs-ofctl", "-O", "OpenFlow13", "add-flow", "br-int", f, ns=G, env=env)
    ovs_on_the_gateway_core(workdir)


def blast(ns: str, dev: str, seconds: float, path: Path) -> tuple[int, float]:
    pin = ["taskset", "-c", str(min(os.sched_getaffinity(0)))]
    out = sh("ip", "netns", "exec", ns, *pin, str(compiled("blast")), dev, str(seconds), str(path)).stdout.split()
    return int(out[0]), float(out[1])


def run(kind: str, seconds: float, flows: int = 1000, fastpath: str = "auto", ovs_mode: str = "native",
        napi: bool = True) -> dict:
    """Packets/s that arrive, each way, through `kind` ('tianji' with `fastpath`, or 'ovs' with its AF_XDP ports in
    `ovs_mode`), and the path used; `napi`: the gateway's receive work on its own core (else in the generator's
    context, as a veth does by default)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"tianji-line-wire-{kind}-"))
    proc = None
    try:
        plumb()
        if kind == "tianji":
            proc = tianji(workdir, fastpath)
            used = read_status(workdir / "gateway-lw.json")["fastpath"].split()[0]
        else:
            ovs(workdir, ovs_mode)
            used = f"ovs {ovs_mode}"
        if napi:
            for ns, dev in ((C, "ul0"), (S, "eth0")):  # the far ends take redirected XDP frames too
                sh("ip", "netns", "exec", ns, "ethtool", "-K", dev, "gro", "on", check=False)
            napi_on_the_gateway_core()
        site_arp()
        result: dict = {"path": used}
        for direction, (ns, dev, counter) in (("out", (C, "ul0", S)), ("in", (S, "eth0", C))):
            path = frames(direction, flows, workdir / f"{direction}.bin")
            blast(ns, dev, 0.5, path)  # warm up: neighbours, OVS's tunnel ARP and megaflows
            time.sleep(1.0)
            before, (busy0, user0, total0) = count(counter), cpu_times(gateway_core())
            sent, elapsed = blast(ns, dev, seconds, path)
            busy1, user1, total1 = cpu_times(gateway_core())
            time.sleep(0.6)
            carried = count(counter) - before
            result[direction] = carried / elapsed
            result[f"{direction}_offered"] = sent / elapsed
            # the gateway core's load (the gateway, its ports' receive work, the far side's counting): at 100%, its
            # rate is its capacity; below, what it carried over that share of the core is
            load = (busy1 - busy0) / max(total1 - total0, 1)
            result[f"{direction}_core"] = load
            result[f"{direction}_core_user"] = (user1 - user0) / max(total1 - total0, 1)  # of which in user space
            result[f"{direction}_capacity"] = carried / elapsed / max(load, 0.01)
        if kind == "tianji":
            result["stage"] = {k: v for k, v in read_status(workdir / "gateway-lw.json")["dataplane"].items()
                               if k in ("line_out", "line_in", "punt", "xdp_carried")}
        return result
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, 15)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
        for pid in ovs_pids(workdir):
            sh("kill", str(pid), check=False)
        for ns in (workdir / "lines").glob("tjl-*"):  # the line's BGP session, should the instance have left it
            sh("ip", "netns", "del", ns.name, check=False)
        down()
        shutil.rmtree(workdir, ignore_errors=True)


__all__ = ["run"]
