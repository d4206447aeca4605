"""SR-IOV provisioning against a simulated sysfs tree and a recording netlink (no SR-IOV hardware here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nfv_gateways.sriov import Sriov, SriovError, VfSpec


class RecordingNetlink:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def link_lookup(self, ifname: str) -> list[int]:
        return [7] if ifname == "pf0" else []

    def link(self, command: str, **kwargs) -> None:
        self.calls.append((command, kwargs))




def sysfs(tmp_path: Path, total: int = 8, current: int = 0) -> Path:
    dev = tmp_path / "class" / "net" / "pf0" / "device"
    dev.mkdir(parents=True)
    (dev / "sriov_totalvfs").write_text(str(total))
    (dev / "sriov_numvfs").write_text(str(current))
    for i in range(total):  # what the kernel would create once VFs exist
        (dev / f"virtfn{i}" / "net" / f"pf0v{i}").mkdir(parents=True)
    return tmp_path


def test_provision_sets_count_and_configures_each_vf(tmp_path: Path) -> None:
    nl = RecordingNetlink()
    s = Sriov(sysfs(tmp_path), nl)
    devs = s.provision("pf0", [VfSpec(0, "02:00:00:00:00:10", vlan=100, trust=True, spoof_check=False),
                               VfSpec(2, "02:00:00:00:00:12")])
    assert devs == ["pf0v0", "pf0v2"]
    assert s.num_vfs("pf0") == 3
    assert nl.calls == [
        ("set", {"index": 7, "vf": {"vf": 0, "mac": "02:00:00:00:00:10"}}),
        ("set", {"index": 7, "vf": {"vf": 0, "vlan": 100}}),
        ("set", {"index": 7, "vf": {"vf": 0, "trust": 1}}),
        ("set", {"index": 7, "vf": {"vf": 0, "spoofchk": 0}}),
        ("set", {"index": 7, "vf": {"vf": 2, "mac": "02:00:00:00:00:12"}}),
        ("set", {"index": 7, "vf": {"vf": 2, "vlan": 0}}),
        ("set", {"index": 7, "vf": {"vf": 2, "trust": 0}}),
        ("set", {"index": 7, "vf": {"vf": 2, "spoofchk": 1}}),
    ]


def test_changing_the_count_goes_through_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = sysfs(tmp_path, current=2)
    writes: list[str] = []
    original = Path.write_text

    def spy(self: Path, data: str, *a, **kw):
        if self.name == "sriov_numvfs":
            writes.append(data)
        return original(self, data, *a, **kw)

    monkeypatch.setattr(Path, "write_text", spy)
    Sriov(root, RecordingNetlink()).set_num_vfs("pf0", 4)
    assert writes == ["0", "4"]


def test_errors_are_clear(tmp_path: Path) -> None:
    s = Sriov(sysfs(tmp_path, total=2), RecordingNetlink())
    with pytest.raises(SriovError, match="at most 2"):
        s.set_num_vfs("pf0", 3)
    with pytest.raises(SriovError, match="no SR-IOV capability"):
        s.total_vfs("eth9")
    with pytest.raises(SriovError, match="no interface"):
        Sriov(sysfs(tmp_path / "x"), RecordingNetlink()).configure_vf("pfX", VfSpec(0, "02:00:00:00:00:01"))
