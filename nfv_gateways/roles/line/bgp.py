"""One BGP session's control plane: FRR (zebra, bgpd, bfdd) in a network namespace of its own, on a tap that the
instance connects to the line's VLAN on the handoff.

The kernel here cannot make VLAN devices, and two tenants' links may use the same addresses, so each session gets
a namespace whose only interface is a tap holding the cloud's address of the link, with the handoff's MAC: the
instance writes into it the frames of the VLAN addressed to that address (ARP, BGP, BFD, ping) and sends what comes
out of it tagged on the VLAN. The session's kernel, not ours, speaks TCP (with TCP-MD5) and answers ARP.

What the session learned is what zebra installed in the namespace's table (`ip route ... proto bgp`); its state is
bgpd's and bfdd's (`vtysh ... json`). FRR's per-namespace pathspace (`-N`) keeps daemons of several sessions apart.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import signal
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from pyroute2 import netns

log = logging.getLogger("tianji.gateway")
FRR = Path("/usr/lib/frr")
DAEMONS = ("zebra", "bfdd", "bgpd")  # in this order: zebra first (the others connect to it)
TUNSETIFF, IFF_TAP, IFF_NO_PI = 0x400454CA, 0x0002, 0x1000
BFD_MS, BFD_MULT = 300, 3  # Direct Connect's: a dead line is seen in 0.9 s
MD5_RECENT_S = 10.0  # a signature failure this recent is why a session is down (the customer retries every second)


@dataclass(frozen=True)
class SessionSpec:
    """What a session's daemons are configured with (a change restarts them)."""

    line_id: str
    vlan: int
    local: str  # ADDRESS/LEN
    customer: str  # ADDRESS
    local_asn: int
    customer_asn: int
    md5: str | None
    max_prefixes: int
    advertise: str  # the VPC's CIDR

    @property
    def local_ip(self) -> str:
        return self.local.split("/")[0]


def namespace_of(instance: str, spec: SessionSpec) -> str:
    return "tjl-" + hashlib.blake2b(f"{instance}|{spec.line_id}|{spec.local}".encode(), digest_size=5).hexdigest()


def frr_available() -> str | None:
    """Why sessions cannot run here, or None."""
    missing = [d for d in DAEMONS if not (FRR / d).exists()]
    if missing or shutil.which("vtysh") is None:
        return f"FRR is not installed ({', '.join(missing) or 'vtysh'} missing): apt-get install frr"
    return None


def bgpd_conf(spec: SessionSpec, ns: str) -> str:
    c = spec.customer
    lines = [f"hostname {ns}", "frr defaults datacenter", "!", f"router bgp {spec.local_asn}",
             f" bgp router-id {spec.local_ip}", " no bgp ebgp-requires-policy", " no bgp network import-check",
             f" neighbor {c} remote-as {spec.customer_asn}", f" neighbor {c} timers connect 1", f" neighbor {c} bfd"]
    if spec.md5:
        lines.append(f" neighbor {c} password {spec.md5}")
    lines += [" address-family ipv4 unicast", f"  network {spec.advertise}",
              f"  neighbor {c} prefix-list tj-vpc out",  # the VPC's CIDR only: never a learned route back
              f"  neighbor {c} maximum-prefix {spec.max_prefixes}", " exit-address-family", "!",
              f"ip prefix-list tj-vpc seq 5 permit {spec.advertise}", "!"]
    return "\n".join(lines) + "\n"


def bfdd_conf(spec: SessionSpec) -> str:
    return (f"bfd\n peer {spec.customer} local-address {spec.local_ip}\n  receive-interval {BFD_MS}\n"
            f"  transmit-interval {BFD_MS}\n  detect-multiplier {BFD_MULT}\n exit\n!\n")


class SessionDaemons:
    def __init__(self, instance: str, spec: SessionSpec, mac: str, workdir: Path) -> None:
        self.spec, self.mac = spec, mac
        self.ns = namespace_of(instance, spec)
        self.tap = self.ns.replace("tjl-", "tl")  # its name in the namespace (15 characters at most)
        self.dir = workdir / self.ns
        self.fd: int | None = None
        self.procs: list[subprocess.Popen] = []
        self.md5_seen, self.md5_until = 0, 0.0  # MD5 failures counted so far; reported as the cause until then

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
        self._ip("addr", "add", self.spec.local, "dev", self.tap)
        self.dir.mkdir(parents=True, exist_ok=True)
        run = Path("/var/run/frr") / self.ns
        run.mkdir(parents=True, exist_ok=True)
        (self.dir / "zebra.conf").write_text(f"hostname {self.ns}\n!\n")
        (self.dir / "bfdd.conf").write_text(bfdd_conf(self.spec))
        (self.dir / "bgpd.conf").write_text(bgpd_conf(self.spec, self.ns))
        for p in (self.dir, run, *self.dir.iterdir()):
            shutil.chown(p, "frr", "frr")
        os.chmod(self.dir, 0o700)  # the MD5 key is in bgpd.conf
        for d in DAEMONS:  # children of the instance, in its process group: they end with it, however it ends
            self.procs.append(subprocess.Popen(
                ["ip", "netns", "exec", self.ns, str(FRR / d), "-N", self.ns, "-f", str(self.dir / f"{d}.conf"),
                 "-i", str(self.dir / f"{d}.pid"), "--log", f"file:{self.dir / d}.log"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            if d == "zebra":
                wait_for_path(run / "zserv.api")
        log.info("private line %s: session %s -> %s (AS %d) in namespace %s", self.spec.line_id, self.spec.local,
                 self.spec.customer, self.spec.customer_asn, self.ns)

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

    def _vtysh(self, cmd: str) -> object:
        out = subprocess.run(["vtysh", "-N", self.ns, "-c", cmd], capture_output=True, text=True, timeout=10)
        return json.loads(out.stdout or "{}")

    def state(self) -> dict:
        """The session's BGP and BFD state and counters, as the daemons say."""
        st = {"bgp_state": "Idle", "bfd_state": "down", "received": 0, "accepted": 0, "advertised": 0,
              "last_error": None}
        try:
            nb = self._vtysh(f"show bgp neighbors {self.spec.customer} json").get(self.spec.customer, {})
            bfd = self._vtysh("show bfd peers json")
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            return st | {"last_error": f"FRR did not answer: {e}"}
        af = nb.get("addressFamilyInfo", {}).get("ipv4Unicast", {})
        st.update(bgp_state=nb.get("bgpState", "Idle"), received=af.get("acceptedPrefixCounter", 0),
                  accepted=af.get("acceptedPrefixCounter", 0), advertised=af.get("sentPrefixCounter", 0))
        reason = nb.get("lastNotificationReason") or nb.get("lastResetDueTo")  # the NOTIFICATION says why
        md5 = self._md5_failures()
        if md5 > self.md5_seen:  # segments dropped for their signature since the last look
            self.md5_seen, self.md5_until = md5, time.monotonic() + MD5_RECENT_S
        if st["bgp_state"] != "Established":
            if time.monotonic() < self.md5_until:
                st["last_error"] = "MD5 mismatch: the customer's router signs with another password (or none)"
            elif reason:
                st["last_error"] = _error_of(reason)
        for peer in bfd if isinstance(bfd, list) else ():
            if peer.get("peer") == self.spec.customer:
                st["bfd_state"] = peer.get("status", "down")
        return st

    def _md5_failures(self) -> int:
        """TCP segments the session's kernel dropped for their MD5 signature (wrong, missing or unexpected)."""
        out = subprocess.run(["ip", "netns", "exec", self.ns, "cat", "/proc/net/netstat"], capture_output=True,
                             text=True, timeout=10).stdout.splitlines()
        for names, values in zip(out[::2], out[1::2], strict=False):
            if names.startswith("TcpExt:"):
                row = dict(zip(names.split()[1:], values.split()[1:], strict=False))
                return sum(int(row.get(k, 0)) for k in ("TCPMD5NotFound", "TCPMD5Unexpected", "TCPMD5Failure"))
        return 0

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


def _error_of(reason: str) -> str:
    """bgpd's words for why the session is down, in the API's (max-prefix exceeded, MD5 mismatch)."""
    low = reason.lower()
    if "maximum number of prefixes" in low or "prefix" in low and ("max" in low or "limit" in low):
        return f"max-prefix exceeded ({reason})"
    return reason


__all__ = ["SessionDaemons", "SessionSpec", "bgpd_conf", "frr_available", "namespace_of", "wait_for_path"]
