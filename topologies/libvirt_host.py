"""libvirt on an emulated hypervisor, to prove the path Nova takes: a domain whose interface is
`<interface type='bridge'><source bridge='br-int'/><virtualport type='openvswitch'><parameters
interfaceid='PORT_ID'/>` is plugged by libvirt itself (its own `ovs-vsctl` transaction: iface-id, attached-mac,
iface-status, vm-id) and programmed by the agent, with nothing of Tianji in the domain.

One libvirtd per hypervisor, in that hypervisor's namespace, in a mount namespace of its own: the hypervisor's
private OVS is where libvirt looks for the system's (/run/openvswitch), and its configuration, sockets and state are
in a directory of the cluster's (`qemu.conf`: QEMU as root with no security driver or virtlogd, as on a lab host).
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING
from xml.sax.saxutils import quoteattr

from topologies.control_plane import alive, stop_group
from topologies.guest_image import GuestImage
from topologies.machines import spawn

if TYPE_CHECKING:
    from topologies.cluster import Cluster

QEMU_CONF = ('user = "root"\ngroup = "root"\nsecurity_driver = "none"\ndynamic_ownership = 0\nremember_owner = 0\n'
             'stdio_handler = "file"\n')
# binds the instance's own directories over libvirt's, and the hypervisor's OVS over the system's, then runs it
START = """set -e
mkdir -p /run/openvswitch /run/libvirt /var/lib/libvirt /var/log/libvirt /var/cache/libvirt
for d in etc run lib log cache; do mkdir -p "$1/$d"; done
mount --bind "$1/etc" /etc/libvirt
mount --bind "$1/run" /run/libvirt
mount --bind "$1/lib" /var/lib/libvirt
mount --bind "$1/log" /var/log/libvirt
mount --bind "$1/cache" /var/cache/libvirt
mount --bind "$2" /run/openvswitch
exec libvirtd -f /etc/libvirt/libvirtd.conf -p "$1/libvirtd.pid"
"""


def uri(base: Path) -> str:
    return f"qemu:///system?socket={base}/run/libvirt-sock"


def virsh(base: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["virsh", "-c", uri(base), *args], capture_output=True, text=True, timeout=60)
    if check and r.returncode:
        raise RuntimeError(f"virsh {' '.join(args)}: {r.stderr.strip()}")
    return r


def start(c: Cluster, host: str) -> Path:
    """libvirtd for hypervisor `host` (once): the directory whose run/libvirt-sock `virsh -c` takes."""
    st = c.state
    info = st.hypervisors[host]
    base = Path(st.dir) / "libvirt" / host
    if info.get("libvirtd_pid") and alive(info["libvirtd_pid"]):
        return base
    (base / "etc").mkdir(parents=True, exist_ok=True)
    (base / "etc" / "qemu.conf").write_text(QEMU_CONF)
    (base / "etc" / "libvirtd.conf").write_text(f'unix_sock_dir = "{base}/run"\n')
    info["libvirtd_pid"] = spawn(info["ns"], ["sh", "-c", START, "start", str(base), info["rundir"]],
                                 base / "libvirtd.log")
    st.pids.append(info["libvirtd_pid"])
    st.save()
    deadline = time.monotonic() + 30
    while virsh(base, "version", check=False).returncode:
        if time.monotonic() > deadline or not alive(info["libvirtd_pid"]):
            raise RuntimeError(f"libvirtd on {host} did not start; see {base / 'libvirtd.log'}")
        time.sleep(0.2)
    return base


def domain_xml(name: str, port_id: str, mac: str, image: GuestImage, console: Path, accel: str) -> str:
    """A domain as Nova writes one for an OVS port. The interface's host offloads are off because the userspace
    datapath does not complete partial checksums (what `vnet_hdr=off` does for plain QEMU)."""
    return f"""<domain type={quoteattr('kvm' if accel == 'kvm' else 'qemu')}>
  <name>{name}</name>
  <memory unit='MiB'>192</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{image.kernel}</kernel>
    <initrd>{image.initrd}</initrd>
    <cmdline>console=ttyS0 quiet tianji.name={name}</cmdline>
  </os>
  <devices>
    <interface type='bridge'>
      <source bridge='br-int'/>
      <virtualport type='openvswitch'>
        <parameters interfaceid={quoteattr(port_id)}/>
      </virtualport>
      <mac address={quoteattr(mac)}/>
      <model type='virtio'/>
      <driver name='qemu'>
        <host csum='off' gso='off' tso4='off' tso6='off' ecn='off' ufo='off'/>
        <guest csum='off' tso4='off' tso6='off' ecn='off' ufo='off'/>
      </driver>
    </interface>
    <serial type='unix'>
      <source mode='bind' path={quoteattr(str(console))}/>
      <target port='0'/>
    </serial>
  </devices>
</domain>
"""


def stop(c: Cluster) -> None:
    """Every domain and libvirtd of the cluster (at `down`, before the namespaces go)."""
    for host, info in c.state.hypervisors.items():
        base = Path(c.state.dir) / "libvirt" / host
        if info.get("libvirtd_pid") and alive(info["libvirtd_pid"]):
            for dom in virsh(base, "list", "--name", check=False).stdout.split():
                virsh(base, "destroy", dom, check=False)
            stop_group(info["libvirtd_pid"], signal.SIGTERM)


__all__ = ["domain_xml", "start", "stop", "uri", "virsh"]
