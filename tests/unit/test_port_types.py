"""How the agent reports the OVS port types in use."""

from __future__ import annotations

from vswitch_agent.cli import port_types


def test_port_types_read_as_a_line() -> None:
    assert port_types({"underlay": "afxdp-nonpmd", "vifs": {"afxdp-nonpmd": 2}}) == \
        "underlay afxdp-nonpmd, VMs 2 afxdp-nonpmd"
