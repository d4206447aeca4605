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

import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from nfv_gateways.core.frr import FrrNamespace, bfdd_conf, frr_available, wait_for_path
from tianji import netns

log = logging.getLogger("tianji.gateway")
MD5_RECENT_S = 10.0  # a signature failure this recent is why a session is down (the customer retries every second)
# a session torn down for too many prefixes comes back by itself after this many minutes (bgpd's `maximum-prefix N
# restart M`; 1 is its least): soon enough that a customer who withdrew the excess is back within a minute without
# calling anyone, slow enough that a router stuck advertising too many costs one teardown a minute, not a flap
MAX_PREFIX_RESTART_MIN = 1


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


def bgpd_conf(spec: SessionSpec, ns: str) -> str:
    c = spec.customer
    lines = [f"hostname {ns}", "frr defaults datacenter", "!", f"router bgp {spec.local_asn}",
             f" bgp router-id {spec.local_ip}", " no bgp ebgp-requires-policy", " no bgp network import-check",
             f" neighbor {c} remote-as {spec.customer_asn}", f" neighbor {c} timers connect 1", f" neighbor {c} bfd"]
    if spec.md5:
        lines.append(f" neighbor {c} password {spec.md5}")
    lines += [" address-family ipv4 unicast", f"  network {spec.advertise}",
              f"  neighbor {c} prefix-list tj-vpc out",  # the VPC's CIDR only: never a learned route back
              f"  neighbor {c} maximum-prefix {spec.max_prefixes} restart {MAX_PREFIX_RESTART_MIN}",
              " exit-address-family", "!",
              f"ip prefix-list tj-vpc seq 5 permit {spec.advertise}", "!"]
    return "\n".join(lines) + "\n"




class SessionDaemons(FrrNamespace):
    """A line's session: FRR in its namespace, the peer the customer's router."""

    def __init__(self, instance: str, spec: SessionSpec, mac: str, workdir: Path) -> None:
        ns = namespace_of(instance, spec)
        super().__init__(ns, ns.replace("tjl-", "tl"), spec.local, spec.customer, mac, workdir,
                         {"bfdd": bfdd_conf(spec.customer, spec.local_ip), "bgpd": bgpd_conf(spec, ns)},
                         f"private line {spec.line_id}: session {spec.local} -> {spec.customer} "
                         f"(AS {spec.customer_asn})", instance)
        self.spec = spec
        self.md5_seen, self.md5_until = 0, 0.0  # MD5 failures counted so far; reported as the cause until then
        self.retry_at: str | None = None  # after a max-prefix teardown: when bgpd restarts the session (UTC)

    def state(self) -> dict:
        """The session's BGP and BFD state and counters, as the daemons say, and why it is down."""
        st, reason = self.peer_state()
        md5 = self._md5_failures()
        if md5 > self.md5_seen:  # segments dropped for their signature since the last look
            self.md5_seen, self.md5_until = md5, time.monotonic() + MD5_RECENT_S
        if st["bgp_state"] != "Established":
            if time.monotonic() < self.md5_until:
                st["last_error"] = "MD5 mismatch: the customer's router signs with another password (or none)"
            elif reason:
                st["last_error"] = _error_of(reason)
        ms = self.neighbor.get("restartInTimerMsec") if st["bgp_state"] != "Established" else None
        if ms is None:
            self.retry_at = None
        else:  # torn down for its prefixes: when bgpd tries again (said once per teardown: the words stay put)
            self.retry_at = self.retry_at or time.strftime("%H:%M:%S", time.gmtime(time.time() + int(ms) / 1000))
            at = self.retry_at
            st["last_error"] = (f"max-prefix exceeded (more than {self.spec.max_prefixes} prefixes): the session "
                                f"retries by itself at {at} UTC, once the site advertises at most "
                                f"{self.spec.max_prefixes}")
        return st

    def _md5_failures(self) -> int:
        """TCP segments the session's kernel dropped for their MD5 signature (wrong, missing or unexpected)."""
        out = netns.sh("cat", "/proc/net/netstat", ns=self.ns, check=False, timeout=10).stdout.splitlines()
        for names, values in zip(out[::2], out[1::2], strict=False):
            if names.startswith("TcpExt:"):
                row = dict(zip(names.split()[1:], values.split()[1:], strict=False))
                return sum(int(row.get(k, 0)) for k in ("TCPMD5NotFound", "TCPMD5Unexpected", "TCPMD5Failure"))
        return 0


def _error_of(reason: str) -> str:
    """bgpd's words for why the session is down, in the API's (max-prefix exceeded, MD5 mismatch)."""
    low = reason.lower()
    if "maximum number of prefixes" in low or "prefix" in low and ("max" in low or "limit" in low):
        return f"max-prefix exceeded ({reason})"
    return reason


__all__ = ["SessionDaemons", "SessionSpec", "bgpd_conf", "frr_available", "namespace_of", "wait_for_path"]
