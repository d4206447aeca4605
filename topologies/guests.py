"""Real KVM guests on an emulated hypervisor: QEMU with a virtio-net NIC on a tap, plugged into br-int by
`iface-id` exactly as libvirt and Nova's os-vif plug one on a real host. The guest's own kernel gets its address
from the switch's DHCP answer and sends its own packets.

QEMU runs in the hypervisor's namespace, so its tap is that host's. It runs with KVM where KVM boots the guest and
under TCG otherwise (`accel()`: probed once per kernel and remembered). The tests drive the guest through its serial
console (`GuestConsole`: one command per line, output between markers) and QEMU through QMP (`qmp`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from topologies.guest_image import BEGIN, END, GUEST_CACHE, READY, GuestImage
from topologies.machines import Hypervisor, spawn
from topologies.netns import sh

GUEST_MEMORY_MB = 192  # the busybox guest needs about 40; the rest is page cache for the tests' transfers
QEMU = "qemu-system-x86_64"


def _qemu_base(image: GuestImage, accel: str, name: str, memory_mb: int) -> list[str]:
    return [QEMU, "-accel", accel, "-m", str(memory_mb), "-smp", "1", "-nographic", "-nodefaults", "-no-user-config",
            "-name", name, "-kernel", str(image.kernel), "-initrd", str(image.initrd),
            "-append", f"console=ttyS0 quiet panic=-1 tianji.name={name}", "-no-reboot"]


def accel(image: GuestImage, progress=print) -> str:
    """`kvm` if /dev/kvm boots this image's kernel to its init within 20 s, else `tcg`: remembered per kernel.
    Some hosts' /dev/kvm (a PVM hypervisor, say) opens but hangs stock guest kernels after the BIOS."""
    memo = GUEST_CACHE / "accel.json"
    key = f"{image.versions.get('kernel')} {image.versions.get('kernel_version')}"
    if memo.exists() and (seen := json.loads(memo.read_text())).get("kernel") == key:
        return seen["accel"]
    chosen, why = "tcg", "no /dev/kvm"
    if os.path.exists("/dev/kvm"):
        progress("probing KVM: does /dev/kvm boot the guest kernel? (20 s at most, once per kernel)")
        p = subprocess.Popen([*_qemu_base(image, "kvm", "probe", 128), "-serial", "stdio"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        out = b""
        deadline = time.monotonic() + 20
        os.set_blocking(p.stdout.fileno(), False)  # type: ignore[union-attr]
        while time.monotonic() < deadline and READY.encode() not in out and p.poll() is None:
            out += p.stdout.read() or b""  # type: ignore[union-attr]
            time.sleep(0.1)
        p.kill()
        p.wait()
        chosen, why = ("kvm", "it boots the guest") if READY.encode() in out else \
            ("tcg", "/dev/kvm did not boot the guest kernel to its init in 20 s")
    memo.write_text(json.dumps({"kernel": key, "accel": chosen, "why": why}))
    progress(f"guests run under {chosen.upper()}: {why}")
    return chosen


def accel_reason() -> str:
    memo = GUEST_CACHE / "accel.json"
    return json.loads(memo.read_text()).get("why", "") if memo.exists() else ""


class GuestConsole:
    """The guest's serial console (QEMU's chardev socket): `run` sends one command line and returns its exit status
    and output. One client at a time, as with a real serial line."""

    def __init__(self, path: Path, timeout: float = 30) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock.connect(str(path))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.buf = b""

    def close(self) -> None:
        self.sock.close()

    def _line(self, deadline: float) -> str:
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer from the guest's console; read so far: {self.buf[-300:]!r}")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                continue
            if not chunk:
                raise ConnectionError("the guest's console closed (did QEMU exit?)")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode(errors="replace").rstrip("\r")

    def wait_for(self, marker: str, timeout: float) -> list[str]:
        deadline, seen = time.monotonic() + timeout, []
        while marker not in (line := self._line(deadline)):
            seen.append(line)
        return seen

    def run(self, command: str, timeout: float = 30) -> tuple[int, str]:
        if "\n" in command:
            raise ValueError("one line per console command")
        self.buf = b""
        self.sock.sendall(command.encode() + b"\n")
        deadline = time.monotonic() + timeout
        while BEGIN not in self._line(deadline):
            pass
        out = []
        while not (line := self._line(deadline)).startswith(END):
            out.append(line)
        return int(line.split()[1]), "\n".join(out)


def qmp(path: Path, command: str, timeout: float = 30, **arguments) -> dict:
    """One QMP command to a QEMU: its `return` (events before it are skipped); raises on its `error`."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        f = s.makefile("rwb")
        json.loads(f.readline())  # the greeting
        for cmd in ({"execute": "qmp_capabilities"}, {"execute": command, "arguments": arguments}):
            f.write(json.dumps(cmd).encode() + b"\n")
            f.flush()
            while "event" in (answer := json.loads(f.readline())):
                pass
            if "error" in answer:
                raise RuntimeError(f"QMP {cmd['execute']}: {answer['error'].get('desc')}")
        return answer.get("return", {})


@dataclass
class KvmGuest:
    """A QEMU guest whose NIC is plugged on hypervisor `hv` for port `port_id`: a tap (`nic="tap"`, any host) or
    vhost-user (`nic="vhost-user"`, an OVS-DPDK host: the guest's memory shared with ovs-vswitchd, no kernel in the
    path). `tap` names the OVS port either way. Its sockets, log and pid file are in `rundir`."""

    name: str
    hv: Hypervisor
    port_id: str
    mac: str
    tap: str
    rundir: Path
    pid: int | None = None
    nic: str = "tap"

    @property
    def console_path(self) -> Path:
        return self.rundir / "console.sock"

    @property
    def qmp_path(self) -> Path:
        return self.rundir / "qmp.sock"

    def make_tap(self, mtu: int) -> None:
        """The tap, made before QEMU opens it (the netdev bridge reads it as a system port), at the largest MTU a
        VPC may have on this host."""
        sh("ip", "tuntap", "add", self.tap, "mode", "tap", ns=self.hv.ns)
        sh("ip", "link", "set", self.tap, "mtu", str(mtu), "up", ns=self.hv.ns)

    @property
    def vhost_socket(self) -> Path:
        return self.rundir / "vhost-user.sock"

    def plug(self, mtu: int) -> str:
        """The same Interface row libvirt's `<virtualport type='openvswitch'>` and os-vif write: for a tap, made
        here first; for vhost-user, OVS the client of the socket QEMU will serve. `mtu`: the largest a VPC may have
        on this host."""
        if self.nic == "vhost-user":
            self.rundir.mkdir(parents=True, exist_ok=True)
            self.hv.ovsdb.plug_vhost_user("br-int", self.tap, self.port_id, self.mac, str(self.vhost_socket), mtu)
            return "dpdkvhostuserclient"
        self.make_tap(mtu)
        return self.hv.plug(self.tap, self.port_id, self.mac)

    def _nic_args(self, memory_mb: int) -> list[str]:
        """`vnet_hdr=off` on a tap: the userspace datapath does not complete a tap's partial checksums (ping would
        work and TCP not). vhost-user: the memory shared (memfd), and `vectors=0`, without which QEMU 7.2 under TCG
        crashes."""
        if self.nic == "vhost-user":
            return ["-object", f"memory-backend-memfd,id=mem,size={memory_mb}M,share=on", "-numa", "node,memdev=mem",
                    "-chardev", f"socket,id=vhu,path={self.vhost_socket},server=on",
                    "-netdev", "type=vhost-user,id=n0,chardev=vhu",
                    "-device", f"virtio-net-pci,netdev=n0,mac={self.mac},romfile=,vectors=0"]
        return ["-netdev", f"tap,id=n0,ifname={self.tap},script=no,downscript=no,vnet_hdr=off",
                "-device", f"virtio-net-pci,netdev=n0,mac={self.mac},romfile="]

    def start(self, image: GuestImage, accel_: str, incoming: str | None = None,
              memory_mb: int = GUEST_MEMORY_MB) -> int:
        """QEMU, detached in the hypervisor's namespace. `incoming`: wait for a migration stream there."""
        self.rundir.mkdir(parents=True, exist_ok=True)
        for p in (self.console_path, self.qmp_path, self.vhost_socket):
            p.unlink(missing_ok=True)
        cmd = [*_qemu_base(image, accel_, self.name, memory_mb), *self._nic_args(memory_mb),
               "-chardev", f"socket,id=con,path={self.console_path},server=on,wait=off", "-serial", "chardev:con",
               "-qmp", f"unix:{self.qmp_path},server=on,wait=off"]
        if incoming:
            cmd += ["-incoming", incoming]
        self.pid = spawn(self.hv.ns, cmd, self.rundir / "qemu.log")
        return self.pid

    def wait_ready(self, timeout: float = 90) -> list[str]:
        """Until the guest's init has its console up (DHCP started): what it printed before."""
        c = GuestConsole(self.console_path)
        try:
            return c.wait_for(READY, timeout)
        finally:
            c.close()

    def run(self, command: str, timeout: float = 30) -> tuple[int, str]:
        c = GuestConsole(self.console_path)
        try:
            return c.run(command, timeout)
        finally:
            c.close()

    def wait_address(self, timeout: float = 30) -> str:
        """The address the guest's DHCP client bound (its own kernel's, read in the guest)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rc, out = self.run("cat /tmp/dhcp-bound 2>/dev/null")
            if rc == 0 and out.strip():
                return out.strip()
            time.sleep(0.3)
        _, log = self.run("cat /tmp/udhcpc.log")
        raise TimeoutError(f"guest {self.name} got no DHCP answer in {timeout} s; its client said: {log[-400:]}")

    def unplug(self) -> None:
        self.hv.vsctl("--if-exists", "del-port", "br-int", self.tap)
        sh("ip", "link", "del", self.tap, ns=self.hv.ns, check=False)


__all__ = ["GuestConsole", "KvmGuest", "accel", "accel_reason", "qmp"]
