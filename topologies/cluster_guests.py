"""KVM guests in the emulated cluster: add one for a port on the port's host, run a command in it, migrate it
live to another hypervisor, remove it. What runs on the hypervisor is guests.py's; this module records it all in the
cluster's state so `down` stops and removes exactly what was made."""

from __future__ import annotations

import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from topologies import netns
from topologies.control_plane import alive, stop_group
from topologies.guest_image import build
from topologies.guests import KvmGuest, accel, accel_reason
from topologies.wiring import underlay_mtu

if TYPE_CHECKING:
    from topologies.cluster import Cluster


def guest_of(c: Cluster, name: str, host: str | None = None) -> KvmGuest:
    info = c.state.vms[name]
    hv = c.hypervisor(host or info["host"])
    return KvmGuest(name, hv, info["port_id"], info["mac"], info["tap"], Path(info["rundir"]), info.get("pid"),
                    info.get("nic", "tap"))


def kvm_add(c: Cluster, port: dict, name: str, progress=print, nic: str = "tap") -> dict:
    """A QEMU guest for `port` on its host: its NIC (a tap, or vhost-user on an OVS-DPDK host) plugged by
    iface-id, QEMU started, its DHCP client's address awaited."""
    st = c.state
    if nic not in ("tap", "vhost-user"):
        raise SystemExit(f"--nic {nic!r}: tap or vhost-user")
    if nic == "vhost-user" and st.hypervisors[port["host"]].get("datapath") != "dpdk":
        raise SystemExit(f"vhost-user needs OVS-DPDK on {port['host']}: `tianji cluster hv dpdk {port['host']}` "
                         "first")
    subnet = c.admin.get(f"/v1/subnets/{port['subnet_id']}")
    image = build(progress)
    how = accel(image, progress)
    guest = KvmGuest(name, c.hypervisor(port["host"]), port["id"], port["mac"], f"tk{port['id'][:8]}",
                     Path(st.dir) / "guests" / name, nic=nic)
    info = {"name": name, "kind": "kvm", "nic": nic, "ns": guest.hv.ns, "port_id": port["id"], "host": port["host"],
            "tap": guest.tap, "ip": port["ip"], "mac": port["mac"], "rundir": str(guest.rundir), "accel": how,
            "pid": None, "prefixlen": int(subnet["cidr"].split("/")[1]), "gateway": subnet["gateway_ip"]}
    st.vms[name] = info
    st.save()
    guest.plug(underlay_mtu(st.topology) - 50)
    t0 = time.monotonic()
    info["pid"] = guest.start(image, how)
    st.pids.append(info["pid"])
    st.save()
    guest.wait_ready(timeout=120)
    info["booted_s"] = round(time.monotonic() - t0, 1)
    info["dhcp_ip"] = guest.wait_address(timeout=60)
    info["ready_s"] = round(time.monotonic() - t0, 1)
    st.save()
    progress(f"guest {name} ({nic}) up under {how.upper()} ({accel_reason()}): init in {info['booted_s']} s, "
             f"DHCP {info['dhcp_ip']} at {info['ready_s']} s")
    return info


def kvm_exec(c: Cluster, name: str, cmd: tuple[str, ...], timeout: float = 30) -> subprocess.CompletedProcess:
    rc, out = guest_of(c, name).run(" ".join(shlex.quote(a) for a in cmd), timeout=timeout)
    return subprocess.CompletedProcess(list(cmd), rc, out + ("\n" if out else ""), "")


def kvm_remove(c: Cluster, name: str) -> None:
    info = c.state.vms[name]
    guest = guest_of(c, name)
    if info.get("pid") and alive(info["pid"]):
        stop_group(info["pid"], signal.SIGKILL)
    guest.unplug()


def kvm_migrate(c: Cluster, name: str, to_host: str, port: int = 4444, downtime_ms: int = 50) -> dict:
    """QEMU live migration of guest `name` to `to_host` over the management network (a disk-less guest: memory
    and device state only), as an orchestrator drives it:
    1. `migrating_to: DEST` on the port: the destination's switch gets the port's flows and every switch sends
       the port's traffic to both hosts;
    2. the destination QEMU waits (`-incoming`) on a new tap plugged by iface-id, and its switch programs it;
    3. QEMU migrates; the guest runs on the destination, whose switch forwards its packets at once;
    4. `host: DEST` ends it: the source's flows go. The source QEMU stops and its tap is unplugged.
    Returns QEMU's figures (downtime, total time) and the binding's own times."""
    from topologies.guests import qmp

    st = c.state
    info = st.vms[name]
    if info.get("nic", "tap") != "tap":
        raise SystemExit(f"{name} has a {info['nic']} NIC: only tap guests migrate in the emulated cluster")
    src = guest_of(c, name)
    dst_hv = c.hypervisor(to_host)
    dst_ip = st.hypervisors[to_host]["mgmt_ip"]
    dst = KvmGuest(name, dst_hv, info["port_id"], info["mac"], info["tap"], Path(info["rundir"]) / to_host)
    c.orchestrator.patch(f"/v1/ports/{info['port_id']}", {"migrating_to": to_host})
    try:
        dst.plug(underlay_mtu(st.topology) - 50)
        image = build(lambda m: None)
        dst.start(image, info["accel"], incoming=f"tcp:{dst_ip}:{port}")
        st.pids.append(dst.pid)  # type: ignore[arg-type]
        st.save()
        deadline = time.monotonic() + 30
        while not _listening(dst_hv.ns, dst_ip, port):  # a probe connection would be taken for the stream
            if time.monotonic() > deadline or not alive(dst.pid):  # type: ignore[arg-type]
                raise RuntimeError(f"the destination QEMU on {to_host} is not listening on {dst_ip}:{port}; see "
                                   f"{dst.rundir / 'qemu.log'}")
            time.sleep(0.05)
        if not dst_hv.wait_port_flows(info["mac"]):
            raise RuntimeError(f"{to_host}'s agent did not program port {info['port_id']} for the migration")
        c.wait_converged()  # every switch sends the port's traffic to both hosts
        qmp(src.qmp_path, "migrate-set-parameters", **{"downtime-limit": downtime_ms})
        qmp(src.qmp_path, "migrate", uri=f"tcp:{dst_ip}:{port}")
        deadline = time.monotonic() + 120
        while (m := qmp(src.qmp_path, "query-migrate")).get("status") not in ("completed", "failed", "cancelled"):
            if time.monotonic() > deadline:
                qmp(src.qmp_path, "migrate_cancel")
                raise TimeoutError(f"migration of {name} to {to_host} still {m.get('status')} after 120 s")
            time.sleep(0.05)
        if m["status"] != "completed":
            raise RuntimeError(f"migration of {name} to {to_host} {m['status']}: {m.get('error-desc', '')}")
    except BaseException:  # the guest stays where it runs: the destination's QEMU, tap and binding go
        if dst.pid is not None and alive(dst.pid):
            stop_group(dst.pid, signal.SIGKILL)
        dst.unplug()
        c.orchestrator.patch(f"/v1/ports/{info['port_id']}", {"migrating_to": None})
        raise
    t_done = time.monotonic()
    c.orchestrator.patch(f"/v1/ports/{info['port_id']}", {"host": to_host})
    stop_group(src.pid, signal.SIGKILL)  # type: ignore[arg-type]
    src.unplug()
    info.update(host=to_host, ns=dst_hv.ns, pid=dst.pid, rundir=str(dst.rundir))
    st.save()
    c.wait_converged()
    return {"downtime_ms": m.get("downtime"), "total_ms": m.get("total-time"), "setup_ms": m.get("setup-time"),
            "binding_moved_ms": round((time.monotonic() - t_done) * 1000, 1)}


def _listening(ns: str, ip: str, port: int) -> bool:
    r = netns.sh("ss", "-Hltn", "src", f"{ip}:{port}", ns=ns, check=False)
    return bool(r.stdout.strip())


__all__ = ["guest_of", "kvm_add", "kvm_exec", "kvm_migrate", "kvm_remove"]
