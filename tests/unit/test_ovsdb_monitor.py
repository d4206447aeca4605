"""The OVSDB monitor's Interface rows: plugged VMs, the tunnel port, and the port types in use."""

from __future__ import annotations

import json

from vswitch_agent.cli import port_types
from vswitch_agent.ovsdb import TUNNEL_PORT, InterfaceTable, monitor_command


def update(rows: list[list]) -> str:
    return json.dumps({"headings": ["row", "action", "name", "ofport", "external_ids", "type"], "data": rows})


def vif(uuid: str, action: str, name: str, ofport: int, port_id: str, typ: str) -> list:
    return [uuid, action, name, ofport, ["map", [["iface-id", port_id]]], typ]


def test_rows_give_ports_tunnel_and_port_types() -> None:
    t = InterfaceTable()
    assert "type" in monitor_command(None)[5].split(",")
    assert t.feed(update([vif("u1", "initial", "tap1", 3, "p1", "afxdp-nonpmd"),
                          vif("u2", "initial", "tap2", 4, "p2", ""),
                          ["u3", "initial", TUNNEL_PORT, 2, ["map", []], "vxlan"]]))
    assert t.interfaces() == ({"p1": 3, "p2": 4}, 2)
    assert t.vif_types() == {"afxdp-nonpmd": 1, "system": 1}
    assert t.feed(update([["u2", "old", None, None, None, ""], vif("", "new", "tap2", 4, "p2", "afxdp-nonpmd")]))
    assert t.vif_types() == {"afxdp-nonpmd": 2}
    assert t.feed(update([vif("u1", "delete", "tap1", 3, "p1", "afxdp-nonpmd")]))
    assert t.interfaces() == ({"p2": 4}, 2)
    assert not t.feed("not json")
    assert port_types({"underlay": "afxdp-nonpmd", "vifs": {"afxdp-nonpmd": 2}}) == \
        "underlay afxdp-nonpmd, VMs 2 afxdp-nonpmd"
