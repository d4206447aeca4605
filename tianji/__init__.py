"""What sits below and above Tianji's components.

Below (every component may import these; they import no component): `tianji.southbound`, the wire schema between
the controller and the hosts (host config and its delta, gateway config and its delta, status reports), and
`tianji.statusfile`. The components: `controller`, `vswitch_agent`, `nfv_gateways`; none imports another.
Above: `tianji.cli` (the `tianji` command, which registers every component's commands) and `topologies`.
`tests/unit/test_layering.py` keeps it so.
"""
