"""The ground floor: what every component may import and what imports no component.

`tianji.southbound`, the wire schema between the controller and the hosts (host config and its delta, gateway
config and its delta, status reports), and `tianji.southbound_client`, the one client hosts speak it with; and
`tianji.statusfile`, `tianji.inet`, `tianji.primes`, `tianji.ratelimit`. Above them the components (`controller`,
`vswitch_agent`, `nfv_gateways`), none importing another; above those `tianjictl` (the `tianji` command and the
API's HTTP client) and `topologies`. `tests/unit/test_layering.py` keeps it so.
"""
