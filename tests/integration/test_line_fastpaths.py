"""The private line on real interfaces, on every fast path (bench/line_wire.py's lab: a VXLAN sender, the
gateway, the customer's side of the handoff): VXLAN in the VPC's VNI becomes VLAN 100 to the customer's router,
and VLAN 100 becomes VXLAN to the VM's host, both ways through the C stage on the native paths. On `packet` the
receiving kernel takes the tag out of the frame (the ring's header holds it) and the backend puts it back; on
`xdp` and `dpdk` it stays in the frame, and on `xdp` the XDP flow cache carries each flow after its first packet.
In CI every backend must start: `make setup` installs DPDK and AF_XDP."""

from __future__ import annotations

import pytest

from bench import line_wire


@pytest.mark.parametrize("fastpath", ["dpdk", "xdp", "packet", "python"])
def test_both_ways_on_every_fast_path(fastpath: str) -> None:
    r = line_wire.run("tianji", 0.3, flows=50, fastpath=fastpath, napi=False)  # the generator pays the receive
    assert r["path"] == fastpath
    for direction in ("out", "in"):  # what arrives was counted at the far side with its VLAN (or VXLAN) matched
        # the C paths carry about what one generator core offers; Python's socket path a fraction of it
        assert r[direction] > (0.5 * r[f"{direction}_offered"] if fastpath != "python" else 1000), r
    if fastpath == "xdp":  # each flow's first packets each way in C (those already in the ring), the rest in XDP
        st = r["stage"]
        assert st["line_out"] >= 50 and st["line_in"] >= 50, r
        assert st["xdp_carried"] > 10 * (st["line_out"] + st["line_in"]), r
    elif fastpath != "python":
        assert r["stage"]["line_out"] > 1000 and r["stage"]["line_in"] > 1000, r
