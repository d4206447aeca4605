"""FRR (zebra, bfdd, bgpd) in a network namespace of the instance's own, on a tap: how a gateway instance speaks
BGP with BFD to a peer beside its data plane (a private line's customer router, the edge router of the external
side).

The instance's interfaces belong to its data plane, and the kernel here cannot make VLAN devices, so each speaker
gets a namespace whose only interface is a tap holding the instance's address towards the peer, with the data
plane's MAC: the instance writes into it the frames addressed to that address (ARP, BGP, BFD, ping) and sends what
comes out of it through the data plane. The namespace's kernel, not ours, speaks TCP (with TCP-MD5) and answers
ARP. Its state is bgpd's and bfdd's (`vtysh ... json`); what it learned is what zebra installed in the namespace's
table (`ip route ... proto bgp`). FRR's per-namespace pathspace (`-N`) keeps several speakers apart."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import signal
import struct
import subprocess
import time
from pathlib import Path

from pyroute2 import netns

log = logging.getLogger("tianji.gateway")
FRR = Path("/usr/lib/frr")
DAEMONS = ("zebra", "bfdd", "bgpd")  # in this order: zebra first (the others connect to it)
TUNSETIFF, IFF_TAP, IFF_NO_PI = 0x400454CA, 0x0002, 0x1000
BFD_MS, BFD_MULT = 300, 3  # Direct Connect's: a dead peer is seen in 0.9 s


def frr_available() -> str | None:
    """Why speakers cannot run here, or None."""
    missing = [d for d in DAEMONS if not (FRR / d).exists()]
    if missing or shutil.which("vtysh") is None:
        return f"FRR is not installed ({', '.join(missing) or 'vtysh'} missing): apt-get install frr"
    return None


def bfdd_conf(peer: str, local_ip: str) -> str:
    return (f"bfd\n peer {peer} local-address {local_ip}\n  receive-interval {BFD_MS}\n"
            f"  transmit-interval {BFD_MS}\n  detect-multiplier {BFD_MULT}\n exit\n!\n")


class FrrNamespace:
    """A namespace `ns` with tap `tap` (address `local`, ADDRESS/LEN, and `mac`) where FRR runs with `confs`
    (daemon -> its config; zebra's is made here), speaking to `peer`."""

    def __init__(self, ns: str, tap: str, local: str, peer: str, mac: str, workdir: Path, confs: dict[str, str],
                 label: str) -> None:
        self.ns, self.tap, self.local, self.peer, self.mac = ns, tap[:15], local, peer, mac
        self.confs, self.label = confs, label
        self.dir = workdir / ns
        self.fd: int | None = None
        self.procs: list[subprocess.Popen] = []

    @property
    def local_ip(self) -> str:
        return self.local.split("/")[0]

    def _ip(self, *args: str, ns: bool = True) -> None:
        subprocess.run(["ip", *(("-n", self.ns) if ns else ()), *args], check=True, capture_output=True)

    def start(self) -> None:
        self.stop()
        netns.create(self.ns)
        fd = os.open("/dev/net/tun", os.O_RDWR)
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", self.tap.encode(), IFF_TAP | IFF_NO_PI))
        self.fd = fd
        self._ip("link", "set", self.tap, "netns", self.ns, ns=False)
        self._ip("link", "set", "lo", "up")
        self._ip("link", "set", self.tap, "address", self.mac, "mtu", "1500", "up")
        self._ip("addr", "add", self.local, "dev", self.tap)
        self.dir.mkdir(parents=True, exist_ok=True)
        run = Path("/var/run/frr") / self.ns
        run.mkdir(parents=True, exist_ok=True)
        (self.dir / "zebra.conf").write_text(f"hostname {self.ns}\n!\n")
        for d, text in self.confs.items():
            (self.dir / f"{d}.conf").write_text(text)
        for p in (self.dir, run, *self.dir.iterdir()):
            shutil.chown(p, "frr", "frr")
        os.chmod(self.dir, 0o700)  # an MD5 key may be in bgpd.conf
        for d in DAEMONS:  # children of the instance, in its process group: they end with it, however it ends
            self.procs.append(subprocess.Popen(
                ["ip", "netns", "exec", self.ns, str(FRR / d), "-N", self.ns, "-f", str(self.dir / f"{d}.conf"),
                 "-i", str(self.dir / f"{d}.pid"), "--log", f"file:{self.dir / d}.log"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            if d == "zebra":
                wait_for_path(run / "zserv.api")
        log.info("%s in namespace %s", self.label, self.ns)

    def stop(self) -> None:
        """Its daemons (by their pid files), its tap and its namespace: nothing of it stays behind."""
        for p in reversed(self.procs):
            p.terminate()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []
        for d in DAEMONS:  # a previous instance's, killed alone before it could stop them: its own daemons only
            try:
                pid = int((self.dir / f"{d}.pid").read_text().split()[0])
                if self.ns.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError, IndexError):
                pass
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.ns in netns.listnetns():
            netns.remove(self.ns)

    def write(self, frame: bytes) -> None:
        if self.fd is not None:
            os.write(self.fd, frame)

    def read(self) -> bytes:
        assert self.fd is not None
        return os.read(self.fd, 65535)

    def vtysh(self, *cmds: str, json_out: bool = True) -> object:
        args = [x for c in cmds for x in ("-c", c)]
        out = subprocess.run(["vtysh", "-N", self.ns, *args], capture_output=True, text=True, timeout=10)
        if not json_out and (out.returncode or "% " in out.stdout):  # vtysh says "% Unknown command" and the like
            raise RuntimeError(f"vtysh -N {self.ns}: {(out.stderr or out.stdout).strip()}")
        return json.loads(out.stdout or "{}") if json_out else out.stdout

    def peer_state(self) -> tuple[dict, str | None]:
        """The session's BGP and BFD state and counters as the daemons say, and the peer's last reason (a
        NOTIFICATION's) or None."""
        st = {"bgp_state": "Idle", "bfd_state": "down", "received": 0, "accepted": 0, "advertised": 0,
              "last_error": None}
        try:
            nb = self.vtysh(f"show bgp neighbors {self.peer} json").get(self.peer, {})  # type: ignore[union-attr]
            bfd = self.vtysh("show bfd peers json")
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            return st | {"last_error": f"FRR did not answer: {e}"}, None
        af = nb.get("addressFamilyInfo", {}).get("ipv4Unicast", {})
        st.update(bgp_state=nb.get("bgpState", "Idle"), received=af.get("acceptedPrefixCounter", 0),
                  accepted=af.get("acceptedPrefixCounter", 0), advertised=af.get("sentPrefixCounter", 0))
        for peer in bfd if isinstance(bfd, list) else ():
            if peer.get("peer") == self.peer:
                st["bfd_state"] = peer.get("status", "down")
        return st, nb.get("lastNotificationReason") or nb.get("lastResetDueTo")

    def learned(self) -> list[str]:
        """The prefixes the session's BGP accepted (as zebra installed them in its namespace)."""
        out = subprocess.run(["ip", "-n", self.ns, "-j", "route", "show", "proto", "bgp"], capture_output=True,
                             text=True, timeout=10)
        try:
            routes = json.loads(out.stdout or "[]")
        except ValueError:
            return []
        return sorted("0.0.0.0/0" if r["dst"] == "default" else r["dst"] if "/" in r["dst"] else f"{r['dst']}/32"
                      for r in routes)


def wait_for_path(path: Path, timeout: float = 10) -> None:
    """Until `path` exists (a daemon's socket); RuntimeError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear in {timeout} s (see the daemon's log beside its config)")
        time.sleep(0.02)


__all__ = ["BFD_MS", "BFD_MULT", "FrrNamespace", "bfdd_conf", "frr_available", "wait_for_path"]
