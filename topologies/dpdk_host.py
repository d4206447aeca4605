"""OVS-DPDK on an emulated hypervisor, for vhost-user guests: that host's ovs-vswitchd is replaced by Debian's DPDK
build (openvswitch-switch-dpdk) on the same database, as an operator moves a host to OVS-DPDK. Bridges, ports and
the agent stay; the new ovs-vswitchd starts with no flows and the agent puts them back (as after any restart).

What DPDK needs here (environment.md): hugepages (2 MiB; a hugetlbfs mounted in the cluster's state directory),
no PCI devices (`--no-pci`: the underlay stays a veth, read by the netdev datapath as before) and a core for its
poll-mode thread, which sleeps up to `pmd-maxsleep` µs when idle rather than spin one of this machine's two cores.
The guests' memory is not hugepages: QEMU shares it with ovs-vswitchd by memfd (guests.py)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from topologies.machines import restart_ovs_daemon

if TYPE_CHECKING:
    from topologies.cluster import Cluster

DPDK_VSWITCHD = "/usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk"
HUGEPAGES_MB = 1024  # DPDK's mbuf pools (socket-limit below) with room for a second DPDK host
SOCKET_MEM_MB, SOCKET_LIMIT_MB = 256, 512
NR_HUGEPAGES = Path("/proc/sys/vm/nr_hugepages")


def dpdk_config(hugedir: Path, prefix: str) -> dict[str, str]:
    """Open_vSwitch other_config for DPDK on an emulated host: EAL on core 0, the PMD on core 1, idle PMD asleep."""
    return {"dpdk-init": "true", "dpdk-socket-mem": str(SOCKET_MEM_MB), "dpdk-socket-limit": str(SOCKET_LIMIT_MB),
            "dpdk-lcore-mask": "0x1", "pmd-cpu-mask": "0x2" if os.cpu_count() and os.cpu_count() > 1 else "0x1",
            "pmd-maxsleep": "1000",
            "dpdk-extra": f"--huge-dir={hugedir} --file-prefix={prefix} --no-pci --no-telemetry"}


def available() -> str | None:
    """None if this machine can run OVS-DPDK, else what to do."""
    if not Path(DPDK_VSWITCHD).exists():
        return f"{DPDK_VSWITCHD} is missing: `apt-get install openvswitch-switch-dpdk` (make setup does)"
    if not Path("/sys/kernel/mm/hugepages/hugepages-2048kB").exists():
        return "this kernel has no 2 MiB hugepages, which DPDK needs"
    return None


def _free_hugepages() -> int:
    return int(Path("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages").read_text())


def reserve_hugepages() -> int:
    """Grow the kernel's 2 MiB pool by what a DPDK switch needs, unless that much is free: the pages added (to be
    given back with `release_hugepages`)."""
    want = HUGEPAGES_MB // 2
    if _free_hugepages() >= want:
        return 0
    before = int(NR_HUGEPAGES.read_text())
    NR_HUGEPAGES.write_text(str(before + want))
    got = int(NR_HUGEPAGES.read_text()) - before
    if _free_hugepages() < want:
        release_hugepages(got)
        raise RuntimeError(f"the kernel gave {got} of {want} 2 MiB hugepages (memory too fragmented?); "
                           "try again after `echo 3 > /proc/sys/vm/drop_caches`")
    return got


def release_hugepages(added: int) -> None:
    if added:
        NR_HUGEPAGES.write_text(str(max(0, int(NR_HUGEPAGES.read_text()) - added)))


def mount_hugetlbfs(d: Path) -> Path:
    if subprocess.run(["mountpoint", "-q", str(d)]).returncode != 0:
        d.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "hugetlbfs", "-o", "pagesize=2M", "nodev", str(d)], check=True)
    return d


def unmount_hugetlbfs(d: Path) -> None:
    if subprocess.run(["mountpoint", "-q", str(d)]).returncode == 0:
        subprocess.run(["umount", str(d)], check=False)


def _reserve_hugepages(c: Cluster) -> None:
    """The pages added are recorded in the cluster's state and given back at `down`."""
    c.state.hugepages_added += reserve_hugepages()
    c.state.save()


def _hugedir(c: Cluster) -> Path:
    return mount_hugetlbfs(Path(c.state.dir) / "hugepages")


def _restart_vswitchd(c: Cluster, hv_name: str, binary: str | None) -> int:
    hv = c.hypervisor(hv_name)
    old, new = restart_ovs_daemon("ovs-vswitchd", hv.ns, hv.rundir, binary=binary)
    c.state.pids = [p for p in c.state.pids if p != old] + [new]
    c.state.save()
    return new


def enable(c: Cluster, hv_name: str, progress=print) -> None:
    """`hv_name`'s switch on OVS-DPDK: hugepages, its ovs-vswitchd restarted as the DPDK build, DPDK initialised,
    the agent's flows back. Idempotent."""
    info = c.state.hypervisors[hv_name]
    if info.get("datapath") == "dpdk":
        return
    if why := available():
        raise SystemExit(why)
    _reserve_hugepages(c)
    hv = c.hypervisor(hv_name)
    hv.vsctl("set", "Open_vSwitch", ".", *(f'other_config:{k}="{v}"' for k, v in
                                             dpdk_config(_hugedir(c), f"{c.state.name}-{hv_name}").items()))
    t0 = time.monotonic()
    _restart_vswitchd(c, hv_name, DPDK_VSWITCHD)
    deadline = time.monotonic() + 60
    while hv.vsctl("get", "Open_vSwitch", ".", "dpdk_initialized").strip() != "true":
        if time.monotonic() > deadline:
            raise RuntimeError(f"DPDK did not initialise on {hv_name} in 60 s; see {hv.rundir}/ovs-vswitchd.log")
        time.sleep(0.2)
    info["datapath"] = "dpdk"
    c.state.save()
    c.wait_agents(timeout=60)
    c.wait_converged(timeout=60)
    version = hv.vsctl("get", "Open_vSwitch", ".", "dpdk_version").strip().strip('"')
    progress(f"{hv_name} runs OVS-DPDK ({version}) after {time.monotonic() - t0:.1f} s; its PMD thread on core 1 "
             "sleeps when idle (pmd-maxsleep 1 ms)")


def disable(c: Cluster, hv_name: str, progress=print) -> None:
    """Back to the plain userspace datapath (the vhost-user guests on it must be gone first)."""
    info = c.state.hypervisors[hv_name]
    if info.get("datapath") != "dpdk":
        return
    if guests := [n for n, v in c.state.vms.items() if v["host"] == hv_name and v.get("nic") == "vhost-user"]:
        raise SystemExit(f"{hv_name} still runs vhost-user guests ({', '.join(guests)}): remove them first")
    hv = c.hypervisor(hv_name)
    hv.vsctl("remove", "Open_vSwitch", ".", "other_config", *dpdk_config(Path("/"), "").keys())
    _restart_vswitchd(c, hv_name, None)
    info.pop("datapath", None)
    c.state.save()
    c.wait_agents(timeout=60)
    c.wait_converged(timeout=60)
    progress(f"{hv_name} runs the plain userspace datapath again")


def release(c: Cluster) -> None:
    """At `down`, after every ovs-vswitchd has stopped: the hugetlbfs unmounted, the hugepages given back."""
    unmount_hugetlbfs(Path(c.state.dir) / "hugepages")
    if c.state.hugepages_added:
        release_hugepages(c.state.hugepages_added)
        c.state.hugepages_added = 0
        c.state.save()


__all__ = ["DPDK_VSWITCHD", "available", "disable", "dpdk_config", "enable", "mount_hugetlbfs", "release",
           "release_hugepages", "reserve_hugepages", "unmount_hugetlbfs"]
