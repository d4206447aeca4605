"""`live`: the source hypervisor's own Open vSwitch asked the same question (`ovs-appctl ofproto/trace`, run by its
agent: vswitch_agent/live_trace.py), and its answer set against the model's. They must agree on where the packet
goes from that switch: dropped, delivered to a local port, tunnelled to a host's VTEP, or handed to the agent. A
difference is a bug in the model or in what the switch holds: the answer says "the switch disagrees".

The question reaches the agent through its config stream (a `trace` event); its answer comes back on
`PUT /v1/hosts/{name}/traces/{id}` (controller/api/traces.py).
"""

from __future__ import annotations

import re
from typing import Any

from controller.reachability.walk import Leg

Outcome = tuple[str, ...]  # ("dropped",) | ("port", port_id) | ("tunnel", vtep_ip) | ("controller",)

_RECIRC = re.compile(r"^=+\nrecirc\(", re.M)
_TUNNEL = re.compile(r"-> tunneling to (\d+\.\d+\.\d+\.\d+)")
_PORT = re.compile(r"-> output port is (\d+)|^\s+output:(\d+)\s*$", re.M)


def switch_outcome(trace: str, ofports: dict[str, int]) -> Outcome:
    """Where ofproto/trace says the packet goes: what its last pass (after the last conntrack recirculation)
    does. `ofports`: the agent's port id -> OpenFlow port, to name the local port."""
    last = _RECIRC.split(trace)[-1]
    if (t := _TUNNEL.search(last)) is not None:
        return ("tunnel", t.group(1))
    if "controller(" in last.split("Datapath actions:")[-1] or "CONTROLLER" in last:
        return ("controller",)
    ports = [int(a or b) for a, b in _PORT.findall(last)]
    if ports:
        by_port = {of: pid for pid, of in ofports.items()}
        return ("port", by_port.get(ports[-1], f"ofport {ports[-1]}"))
    return ("dropped",)


def model_outcome(leg: Leg) -> Outcome:
    return leg.first or ("dropped",)


def compare(leg: Leg, result: dict[str, Any] | None, host: str) -> dict[str, Any]:
    """The `live` part of an answer."""
    model = model_outcome(leg)
    if result is None:
        return {"host": host, "agrees": None, "model": _words(model), "switch": None,
                "note": f"the agent on {host} did not answer in time (is it streaming? `tianji host show {host}`)"}
    if result.get("error"):
        return {"host": host, "agrees": None, "model": _words(model), "switch": None,
                "note": f"the agent on {host} could not trace: {result['error']}"}
    switch = switch_outcome(result.get("output", ""), result.get("ofports", {}))
    agrees = switch == model
    out = {"host": host, "agrees": agrees, "model": _words(model), "switch": _words(switch),
           "trace": result.get("output", "")[-4000:]}
    if not agrees:
        out["note"] = (f"the switch disagrees: the model says the packet is {_words(model)}, Open vSwitch on {host} "
                       f"says {_words(switch)}; this is a bug (report it with this answer)")
    return out


def _words(o: Outcome) -> str:
    return {"dropped": "dropped", "port": "delivered to port {}", "tunnel": "tunnelled to VTEP {}",
            "controller": "handed to the agent"}[o[0]].format(*o[1:])
