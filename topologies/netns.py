"""The one toolkit for network namespaces and links: what every lab, fabric and bench here builds with (the
emulated hypervisors' fabric, the gateway labs, the benches' labs), so that a namespace is made, a veth paired and
an interface readied the same way everywhere.

Commands run through `sh`, which says which command failed and why. Nothing is ever removed here that its caller
did not make: `delete` takes the names the caller recorded."""

from __future__ import annotations

from collections.abc import Iterable

from tianji.netns import argv, popen, sh  # noqa: F401 -- commands in a namespace, re-exported for the labs


def add(name: str) -> str:
    """A new namespace with its loopback up."""
    sh("ip", "netns", "add", name)
    sh("ip", "-n", name, "link", "set", "lo", "up")
    return name


def delete(names: Iterable[str]) -> None:
    """Remove these namespaces (those that still exist), and with them every interface inside."""
    for n in names:
        sh("ip", "netns", "del", n, check=False)


def veth(a: str, a_ns: str | None, b: str, b_ns: str | None, *, up: bool = True, mtu: int | None = None,
         full_checksums: bool = False, a_mac: str | None = None) -> None:
    """A veth pair: `a` in `a_ns` (with MAC `a_mac`), `b` in `b_ns` (None: the root namespace). `full_checksums`:
    turn off transmit checksum offload at both ends: a packet socket or XDP program on the other side cannot
    complete a veth's partial checksum, so frames must leave with theirs whole."""
    cmd = ["ip", "link", "add", a, *(["netns", a_ns] if a_ns else []), *(["address", a_mac] if a_mac else []),
           "type", "veth", "peer", "name", b, *(["netns", b_ns] if b_ns else [])]
    sh(*cmd)
    for ns, dev in ((a_ns, a), (b_ns, b)):
        if mtu is not None:
            sh("ip", "link", "set", dev, "mtu", str(mtu), ns=ns)
        if full_checksums:
            sh("ethtool", "-K", dev, "tx", "off", ns=ns, check=False)
        if up:
            sh("ip", "link", "set", dev, "up", ns=ns)


def address(ns: str | None, dev: str, *cidrs: str) -> None:
    for c in cidrs:
        sh("ip", "addr", "add", c, "dev", dev, ns=ns)


def up(ns: str | None, *devs: str) -> None:
    for d in devs:
        sh("ip", "link", "set", d, "up", ns=ns)
