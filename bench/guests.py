"""Real guests (root): KVM guest to KVM guest across two hypervisors through Tianji's pipeline, against the same two
guests on bare Open vSwitch bridges (one NORMAL flow, the same VXLAN and underlay ports) measured in the same run;
and the loss a 10 ms ping sees over live migrations.

    python bench/guests.py [--megabytes 32] [--rounds 3] [--migrations 10] [--skip-throughput] [--skip-vhost-user]

Throughput: `dd | nc` of MEGABYTES in one TCP connection, timed by the guest's own `time`; latency: the guest's
ping, 20 at 50 ms; each row's median over ROUNDS, the rows' transfers interleaved. Guests run under TCG on machines
whose KVM does not boot them (the emulated CPU then bounds both rows alike: the ratio is what the pipeline costs).
The bare bridges run beside the cluster. vhost-user: hv3 moved to OVS-DPDK, its guests against taps and against a
bare OVS-DPDK bridge in the same run (`--skip-vhost-user` leaves it out).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.ovs_baseline import FLOWS, VNI
from topologies import netns
from topologies.cluster import Cluster
from topologies.cluster_guests import guest_of, kvm_migrate
from topologies.control_plane import stop_group
from topologies.guest_image import build
from topologies.guests import KvmGuest, accel
from topologies.machines import Hypervisor, ovs_env, ovs_pids, sh, start_private_ovs

STATE = Path("/run/tianji-bench-guests")


def throughput(src: KvmGuest, dst: KvmGuest, dst_ip: str, megabytes: int) -> float:
    """Mbit/s of one TCP connection from `src` to `dst`, timed in the sending guest; every byte must arrive."""
    # the listener's stdin held open: busybox nc closes the connection when its stdin ends
    dst.run("rm -f /tmp/rx; (sleep 300 | nc -l -p 5001 | wc -c > /tmp/rx) >/dev/null 2>&1 &")
    time.sleep(0.5)
    rc, out = src.run(f"time sh -c 'dd if=/dev/zero bs=64k count={megabytes * 16} 2>/dev/null | nc {dst_ip} 5001'",
                      timeout=300)
    m = re.search(r"real\s+(\d+)m\s*([\d.]+)s", out)
    deadline = time.monotonic() + 10
    while (got := dst.run("cat /tmp/rx 2>/dev/null")[1].strip()) == "" and time.monotonic() < deadline:
        time.sleep(0.2)
    if rc or not m or got != str(megabytes << 20):
        raise RuntimeError(f"the transfer from {src.name} failed (received {got or 'nothing'}): {out[-300:]}")
    return megabytes * 8 * 1.048576 / (int(m.group(1)) * 60 + float(m.group(2)))


def rtt(src: KvmGuest, dst_ip: str) -> float:
    src.run(f"ping -c 3 -W 1 {dst_ip}")  # warm: ARP, the first packet to a new VTEP
    _, out = src.run(f"ping -c 20 -i 0.05 {dst_ip}", timeout=60)
    return float(re.search(r"min/avg/max = [\d.]+/([\d.]+)/", out).group(1))  # type: ignore[union-attr]


Pair = tuple[KvmGuest, KvmGuest, str]  # sender, receiver, the receiver's address


def interleaved(pairs: dict[str, Pair], megabytes: int, rounds: int) -> dict[str, dict]:
    """Each pair's throughput, one transfer per pair per round, rounds interleaved (the machine's pace drifts
    within a run: each row meets it alike), and its RTT the same way: medians."""
    mbits: dict[str, list[float]] = {k: [] for k in pairs}
    rtts: dict[str, list[float]] = {k: [] for k in pairs}
    for r in range(rounds):
        for name, (a, b, ip) in pairs.items():
            mbits[name].append(throughput(a, b, ip, megabytes))
            rtts[name].append(rtt(a, ip))
        print(f"  round {r + 1}/{rounds}: " + ", ".join(f"{k} {v[-1]:.1f} Mbit/s" for k, v in mbits.items()),
              flush=True)
    return {k: {"mbit_s": round(statistics.median(mbits[k]), 1), "rtt_ms": round(statistics.median(rtts[k]), 3),
                "runs_mbit_s": [round(x, 1) for x in mbits[k]]} for k in pairs}


def add_guest(c: Cluster, subnet_id: str, name: str, host: str, nic: str = "tap") -> KvmGuest:
    p = c.orchestrator.post("/v1/ports", {"subnet_id": subnet_id, "name": name, "host": host})
    c.vm_add(p["id"], name, kind="kvm", nic=nic, progress=lambda m: None)
    return guest_of(c, name)


def on_tianji(c: Cluster) -> tuple[Pair, str]:
    """g1 on hv1 to g2 on hv2, taps; the subnet's id."""
    t = c.admin.post("/v1/tenants", {"name": f"bench-{uuid.uuid4().hex[:6]}"})
    cl = c.client(t["token"])
    vpc = cl.post("/v1/vpcs", {"name": "bench", "cidr": "10.90.0.0/16"})
    sn = cl.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "s", "cidr": "10.90.1.0/24"})
    sg = vpc["default_security_group_id"]
    cl.post(f"/v1/security-groups/{sg}/rules", {"direction": "ingress", "protocol": "any",
                                                "remote_cidr": "10.90.0.0/16"})
    a, b = add_guest(c, sn["id"], "g1", "hv1"), add_guest(c, sn["id"], "g2", "hv2")
    return (a, b, c.state.vms["g2"]["ip"]), sn["id"]


def vhost_user_pairs(c: Cluster, subnet_id: str) -> tuple[dict[str, Pair], dict[str, Pair]]:
    """hv3 on OVS-DPDK: a vhost-user guest sending to a tap guest on hv2 across the tunnel, beside a tap guest on
    hv1 doing the same; and two guests on one host, vhost-user on hv3 against taps on hv1. New guests, placed here
    (g1 may have migrated). (across hosts, on one host)."""
    from topologies import dpdk_host

    dpdk_host.enable(c, "hv3", progress=lambda m: print(f"> {m}", flush=True))
    v1, v2 = add_guest(c, subnet_id, "v1", "hv3", "vhost-user"), add_guest(c, subnet_id, "v2", "hv3", "vhost-user")
    t1, t2, sink = (add_guest(c, subnet_id, n, h) for n, h in (("t1", "hv1"), ("t2", "hv1"), ("t3", "hv2")))
    ip = {n: c.state.vms[n]["ip"] for n in ("t2", "t3", "v2")}
    return ({"vhost_user_to_tap_across": (v1, sink, ip["t3"]), "tap_to_tap_across": (t1, sink, ip["t3"])},
            {"vhost_user_same_host": (v1, v2, ip["v2"]), "tap_same_host": (t1, t2, ip["t2"])})


@contextmanager
def bare_bridges(how: str, underlay_type: str, first_nic: str = "tap") -> Iterator[Pair]:
    """The same two guests on two namespaces' bare OVS: br-int with the guest's NIC and a VXLAN port, NORMAL (the
    VNI set by one flow); br-phy on the underlay veth, of the port type the cluster's hypervisors use.
    `first_nic="vhost-user"`: the sending guest's host runs OVS-DPDK and plugs it by vhost-user (as hv3 above)."""
    from topologies import dpdk_host

    tag = "tjgb"
    hosts = [f"{tag}h{i}" for i in (1, 2)]
    base = Path(tempfile.mkdtemp(prefix="tianji-bench-guests-"))
    guests: list[KvmGuest] = []
    image = build(lambda m: None)
    hugepages, hugedir = 0, base / "hugepages"
    try:
        for h in hosts:
            netns.add(h)
        netns.veth("ul0", hosts[0], "ul0", hosts[1], up=False)
        for i, h in enumerate(hosts, start=1):
            run = base / h
            nic = first_nic if i == 1 else "tap"
            if nic == "vhost-user":
                hugepages = dpdk_host.reserve_hugepages()
                start_private_ovs(h, run, dpdk_host.dpdk_config(dpdk_host.mount_hugetlbfs(hugedir), tag),
                                  dpdk_host.DPDK_VSWITCHD)
            else:
                start_private_ovs(h, run)

            def vsctl(*a: str, h: str = h, run: Path = run) -> None:
                sh("ovs-vsctl", f"--db=unix:{run}/db.sock", *a, ns=h, env=ovs_env(run))

            sh("ip", "link", "set", "ul0", "mtu", "1500", "up", ns=h)
            vsctl("add-br", "br-phy", "--", "set", "bridge", "br-phy", "datapath_type=netdev",
                  f"other_config:hwaddr=02:00:00:00:0{i}:fe", "--", "add-port", "br-phy", "ul0", "--",
                  "set", "interface", "ul0", f"type={underlay_type}")
            sh("ip", "addr", "add", f"172.31.9.{i}/24", "dev", "br-phy", ns=h)
            sh("ip", "link", "set", "br-phy", "up", ns=h)
            vsctl("add-br", "br-int", "--", "set", "bridge", "br-int", "datapath_type=netdev", "--",
                  "add-port", "br-int", "vxlan0", "--", "set", "interface", "vxlan0", "type=vxlan",
                  f"options:remote_ip=172.31.9.{3 - i}", f"options:local_ip=172.31.9.{i}", "options:key=flow")
            hv = Hypervisor(h, h, run, f"172.31.9.{i}/24", "")
            g = KvmGuest(f"bare{i}", hv, f"bare-{i}", f"02:00:00:00:0{i}:01", "tapbare", base / f"g{i}", nic=nic)
            g.plug(1450)
            sh("ovs-ofctl", "del-flows", "br-int", ns=h, env=ovs_env(run))
            for f in FLOWS["bare"]:
                sh("ovs-ofctl", "add-flow", "br-int", f.format(vm="tapbare", vni=VNI), ns=h, env=ovs_env(run))
            g.start(image, how)
            g.wait_ready()  # its console from the start: the init's output before a connection is not kept
            guests.append(g)
        for i, g in enumerate(guests, start=1):
            g.run(f"kill $(cat /run/udhcpc.pid) 2>/dev/null; ip link set eth0 mtu 1450 up; "
                  f"ip addr add 10.99.0.{i}/24 dev eth0")
        yield guests[0], guests[1], "10.99.0.2"
    finally:
        for g in guests:
            if g.pid:
                stop_group(g.pid, signal.SIGKILL)
        for h in hosts:
            for pid in ovs_pids(base / h):
                sh("kill", str(pid), check=False)
        netns.delete(hosts)
        time.sleep(0.5)  # the DPDK ovs-vswitchd lets its hugepages go as it exits
        dpdk_host.unmount_hugetlbfs(hugedir)
        dpdk_host.release_hugepages(hugepages)
        shutil.rmtree(base, ignore_errors=True)


def migrations(c: Cluster, count: int) -> list[dict]:
    """`count` live migrations of g1 between hv1 and hv2 while a namespace VM on hv3 pings it every 10 ms: the
    longest run of lost answers each time, in ms, beside QEMU's own downtime."""
    g = c.state.vms["g1"]
    cl = c.orchestrator
    port = cl.get(f"/v1/ports/{g['port_id']}")
    p = cl.post("/v1/ports", {"subnet_id": port["subnet_id"], "name": "pinger", "host": "hv3"})
    vm = c.vm_add(p["id"], "pinger", dhcp=True)
    out = []
    for k in range(count):
        to = "hv2" if c.state.vms["g1"]["host"] == "hv1" else "hv1"
        ping = subprocess.Popen(["ip", "netns", "exec", vm["ns"], "ping", "-i", "0.01", "-W", "1", "-w", "12",
                                 g["ip"]], stdout=subprocess.PIPE, text=True)
        time.sleep(1)
        fig = kvm_migrate(c, "g1", to, port=4444 + k)
        text, _ = ping.communicate(timeout=60)
        seqs = sorted({int(x) for x in re.findall(r"icmp_seq=(\d+)", text)})
        lost = max((b - a - 1 for a, b in zip(seqs, seqs[1:], strict=False)), default=0) * 10
        out.append({"to": to, "lost_ms": lost, "qemu_downtime_ms": fig["downtime_ms"],
                    "migration_ms": fig["total_ms"]})
        print(f"  migration {k + 1}/{count} to {to}: ping lost {lost} ms (QEMU downtime {fig['downtime_ms']} ms, "
              f"migration {fig['total_ms']} ms)", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--megabytes", type=int, default=32)
    ap.add_argument("--migrations", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved transfers per row (medians)")
    ap.add_argument("--settle", type=float, default=30, help="seconds to wait after bring-up before measuring")
    ap.add_argument("--skip-throughput", action="store_true", help="no bare-bridge baselines")
    ap.add_argument("--skip-vhost-user", action="store_true", help="no OVS-DPDK host, no vhost-user rows")
    a = ap.parse_args()
    how = accel(build(print), print)
    res: dict = {"accel": how}
    c = Cluster.up("small", name="tjbg", state_dir=STATE, progress=lambda m: print(f"> {m}", flush=True))
    # the bare bridges run beside the cluster, their transfers interleaved with the same rows through it: both then
    # share the two cores with the controller, the gateway instances and the agents, and the machine's drift
    try:
        tianji, subnet_id = on_tianji(c)
        underlay = c.agent_status("hv1").get("port_types", {}).get("underlay", "system")
        print(f"> settling {a.settle} s (a cluster's first minute: audits, first configs)", flush=True)
        time.sleep(a.settle)
        if a.skip_throughput:
            res |= interleaved({"tianji": tianji}, a.megabytes, a.rounds)
        else:
            with bare_bridges(how, underlay) as bare:
                res |= interleaved({"tianji": tianji, "bare": bare}, a.megabytes, a.rounds)
            res["ratio_throughput"] = round(res["tianji"]["mbit_s"] / res["bare"]["mbit_s"], 2)
            res["ratio_rtt"] = round(res["tianji"]["rtt_ms"] / res["bare"]["rtt_ms"], 2)
        if a.migrations:
            res["migrations"] = migrations(c, a.migrations)
        if not a.skip_vhost_user:
            across, one_host = vhost_user_pairs(c, subnet_id)
            if a.skip_throughput:
                res["vhost_user"] = interleaved(across, a.megabytes, a.rounds)
            else:
                with bare_bridges(how, underlay, first_nic="vhost-user") as bare:
                    res["vhost_user"] = interleaved(across | {"bare_vhost_user": bare}, a.megabytes, a.rounds)
                res["bare_vhost_user"] = res["vhost_user"].pop("bare_vhost_user")
            res["vhost_user"] |= interleaved(one_host, a.megabytes, a.rounds)
    finally:
        c.down()
    print(f"\n| guests ({how.upper()}, tap, vnet_hdr off) | TCP Mbit/s (median of {a.rounds}) | RTT ms |\n"
          "|---|---|---|")
    for k in ("tianji", "bare"):
        if k in res:
            print(f"| {k} | {res[k]['mbit_s']} | {res[k]['rtt_ms']} |")
    if "ratio_throughput" in res:
        print(f"Tianji / bare bridge: throughput {res['ratio_throughput']}x, RTT {res['ratio_rtt']}x")
    if v := res.get("vhost_user"):
        print(f"\n| Tianji, {how.upper()} guests (hv3 on OVS-DPDK, its PMD thread on core 1 of {os.cpu_count()}) "
              "| TCP Mbit/s | RTT ms |\n|---|---|---|")
        for k, label in (("vhost_user_to_tap_across", "vhost-user (hv3) to tap (hv2)"),
                         ("tap_to_tap_across", "tap (hv1) to tap (hv2)"),
                         ("vhost_user_same_host", "vhost-user to vhost-user (hv3)"),
                         ("tap_same_host", "tap to tap (hv1)")):
            print(f"| {label} | {v[k]['mbit_s']} | {v[k]['rtt_ms']} |")
        res["ratio_vhost_user_across"] = round(v["vhost_user_to_tap_across"]["mbit_s"] /
                                               v["tap_to_tap_across"]["mbit_s"], 2)
        res["ratio_vhost_user_same_host"] = round(v["vhost_user_same_host"]["mbit_s"] / v["tap_same_host"]["mbit_s"],
                                                  2)
        print(f"vhost-user / tap throughput: across hosts {res['ratio_vhost_user_across']}x, same host "
              f"{res['ratio_vhost_user_same_host']}x")
        if b := res.get("bare_vhost_user"):
            t = v["vhost_user_to_tap_across"]
            res["ratio_vhost_user_bare"] = round(t["mbit_s"] / b["mbit_s"], 2)
            print(f"| bare OVS-DPDK + OVS, vhost-user to tap | {b['mbit_s']} | {b['rtt_ms']} |\n"
                  f"Tianji / bare, vhost-user to tap: throughput {res['ratio_vhost_user_bare']}x, "
                  f"RTT {round(t['rtt_ms'] / b['rtt_ms'], 2)}x")
    if res.get("migrations"):
        lost = [m["lost_ms"] for m in res["migrations"]]
        print(f"live migrations: {len(lost)}, ping lost per migration (ms) {lost}, max {max(lost)}")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
