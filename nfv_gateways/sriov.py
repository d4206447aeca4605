"""SR-IOV virtual functions for gateway ports, provisioned the way a real host does it.

The number of VFs is set through sysfs (`/sys/class/net/<pf>/device/sriov_numvfs`, which must go through 0 to
change); each VF's MAC, VLAN, trust and spoof checking are set over netlink on the physical function (pyroute2);
the VF's own netdev (`.../device/virtfn<N>/net/<name>`) is then handed to the fast path like any other port.

UNVERIFIED ON HARDWARE: these machines have no SR-IOV NICs. The module is tested against a simulated sysfs tree
and a recording netlink stand-in; the first run on a real NIC needs someone to watch it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


class Netlink(Protocol):
    def link_lookup(self, ifname: str) -> list[int]: ...
    def link(self, command: str, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class VfSpec:
    index: int
    mac: str
    vlan: int = 0  # 0: untagged
    trust: bool = False
    spoof_check: bool = True


class SriovError(RuntimeError):
    pass


class Sriov:
    def __init__(self, sysfs: Path = Path("/sys"), netlink: Netlink | None = None) -> None:
        self.sysfs = sysfs
        self._netlink = netlink

    @property
    def netlink(self) -> Netlink:
        if self._netlink is None:
            from pyroute2 import IPRoute

            self._netlink = IPRoute()
        return self._netlink

    def _dev(self, pf: str) -> Path:
        d = self.sysfs / "class" / "net" / pf / "device"
        if not (d / "sriov_totalvfs").exists():
            raise SriovError(f"{pf} has no SR-IOV capability (no {d / 'sriov_totalvfs'})")
        return d

    def total_vfs(self, pf: str) -> int:
        return int((self._dev(pf) / "sriov_totalvfs").read_text())

    def num_vfs(self, pf: str) -> int:
        return int((self._dev(pf) / "sriov_numvfs").read_text())

    def set_num_vfs(self, pf: str, n: int) -> None:
        """The kernel refuses to change a non-zero VF count directly: go through 0."""
        total = self.total_vfs(pf)
        if not 0 <= n <= total:
            raise SriovError(f"{pf} supports at most {total} VFs, not {n}")
        current = self.num_vfs(pf)
        if current == n:
            return
        path = self._dev(pf) / "sriov_numvfs"
        if current:
            path.write_text("0")
        path.write_text(str(n))

    def vf_netdev(self, pf: str, vf: int) -> str:
        net = self._dev(pf) / f"virtfn{vf}" / "net"
        names = sorted(p.name for p in net.iterdir()) if net.is_dir() else []
        if not names:
            raise SriovError(f"VF {vf} of {pf} has no network device (driver not bound?)")
        return names[0]

    def configure_vf(self, pf: str, spec: VfSpec) -> None:
        idx = self.netlink.link_lookup(ifname=pf)
        if not idx:
            raise SriovError(f"no interface {pf}")
        for attrs in ({"mac": spec.mac}, {"vlan": spec.vlan}, {"trust": int(spec.trust)},
                      {"spoofchk": int(spec.spoof_check)}):
            self.netlink.link("set", index=idx[0], vf={"vf": spec.index, **attrs})

    def provision(self, pf: str, specs: Iterable[VfSpec]) -> list[str]:
        """Create enough VFs, configure each, and return their netdevs (in the order of `specs`)."""
        specs = list(specs)
        want = max((s.index for s in specs), default=-1) + 1
        if want > self.num_vfs(pf):
            self.set_num_vfs(pf, want)
        for s in specs:
            self.configure_vf(pf, s)
        return [self.vf_netdev(pf, s.index) for s in specs]
