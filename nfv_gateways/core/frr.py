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

from tianji import netns as ns_exec

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
                 label: str, owner: str) -> None:
        self.ns, self.tap, self.local, self.peer, self.mac = ns, tap[:15], local, peer, mac
        self.confs, self.label = confs, label
        self.dir = workdir / ns
        self.fd: int | None = None
        self.procs: list[subprocess.Popen] = []
        self.owner = owner
        self.lifeline: int | None = None
        self.reaper: subprocess.Popen | None = None
        self.neighbor: dict = {}  # bgpd's last word on the peer (show bgp neighbors json)

    @property
    def local_ip(self) -> str:
        return self.local.split("/")[0]

    def _ip(self, *args: str, ns: bool = True) -> None:
        subprocess.run(["ip", *(("-n", self.ns) if ns else ()), *args], check=True, capture_output=True)

    def start(self) -> None:
        self.stop()
        netns.create(self.ns)
        # the speaker's kernel says nothing of its own on the wire (no IPv6 router solicitations, no DAD): only
        # what its daemons speak leaves through the instance
        ns_exec.sh("sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1",
                 ns=self.ns)
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
        (self.dir / "owner").write_text(self.owner)
        self._lifeline()
        for d in DAEMONS:  # they end with the instance, however it ends: the reaper (_lifeline) sees to it
            self.procs.append(ns_exec.popen(
                str(FRR / d), "-N", self.ns, "-f", str(self.dir / f"{d}.conf"), "-i", str(self.dir / f"{d}.pid"),
                "--log", f"file:{self.dir / d}.log", ns=self.ns,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            if d == "zebra":
                wait_for_path(run / "zserv.api")
        log.info("%s in namespace %s", self.label, self.ns)

    def _lifeline(self) -> None:
        """A reaper for the namespace, in a session of its own, that waits on a pipe only this process holds open:
        when the instance ends (stop(), a crash, kill -9, the OOM killer), the pipe closes and the reaper kills
        every process left in the namespace and removes it. FRR's daemons drop privileges, which clears a
        parent-death signal, and a signal to the instance alone does not reach its children: hence a watcher."""
        r, w = os.pipe()  # not inheritable (PEP 446): the daemons and other children never hold the write end
        self.reaper = subprocess.Popen(["sh", "-c", REAPER, "tianji-frr-reaper", self.ns], stdin=r,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(r)
        self.lifeline = w

    def stop(self) -> None:
        """Its daemons (bgpd first: it tells the peer with a NOTIFICATION), then anything left in its namespace,
        its tap and the namespace: nothing of it stays behind."""
        for p in reversed(self.procs):
            p.terminate()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []
        if self.lifeline is not None:  # the reaper's turn, waited for: it must not outlive into a new start
            os.close(self.lifeline)
            self.lifeline = None
            if self.reaper is not None:
                self.reaper.wait(10)
                self.reaper = None
        reap(self.dir)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

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
        self.neighbor = nb
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


# kill -9 what is left in the namespace (by `ip netns pids`: whatever runs there, under any pid file), then remove it
REAPER = ('cat >/dev/null; for p in $(ip netns pids "$1" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done; '
          'ip netns del "$1" 2>/dev/null; exit 0')


def reap(ns_dir: Path) -> None:
    """What a speaker whose working directory is `ns_dir` left: its daemons (their pid files, checked to be FRR's
    for that namespace), anything else in its namespace, and the namespace."""
    ns = ns_dir.name
    for d in DAEMONS:
        try:
            pid = int((ns_dir / f"{d}.pid").read_text().split()[0])
            if ns.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            pass
    if ns in netns.listnetns():
        for pid in netns_pids(ns):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        netns.remove(ns)


def netns_pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10).stdout
    return [int(x) for x in out.split() if x.isdigit()]


def reap_left_by(workdir: Path, owner: str) -> list[str]:
    """At an instance's start: the speakers an earlier run of the same instance (`owner`) left behind, killed
    with it before its reapers could run (or with them): reaped. Returns their namespaces."""
    left = []
    for d in sorted(workdir.glob("*/owner")) if workdir.is_dir() else []:
        try:
            if d.read_text().strip() != owner:
                continue
        except OSError:
            continue
        reap(d.parent)
        left.append(d.parent.name)
    if left:
        log.warning("reaped what an earlier run of %s left: %s", owner, ", ".join(left))
    return left


def wait_for_path(path: Path, timeout: float = 10) -> None:
    """Until `path` exists (a daemon's socket); RuntimeError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear in {timeout} s (see the daemon's log beside its config)")
        time.sleep(0.02)


__all__ = ["BFD_MS", "BFD_MULT", "FrrNamespace", "bfdd_conf", "frr_available", "reap_left_by", "wait_for_path"]
