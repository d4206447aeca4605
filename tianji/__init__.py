"""The ground floor: what every component may import and what imports no component.

`tianji.southbound`, the wire schema between the controller and the hosts (host config and its delta, gateway
config and its delta, status reports), and `tianji.southbound_client`, the one client hosts speak it with;
`tianji.api_client`, the tenant and operator API's HTTP client (the command's, the emulated cluster's); and
`tianji.statusfile`, `tianji.inet`, `tianji.primes`, `tianji.ratelimit`. Above them the components (`controller`,
`vswitch_agent`, `nfv_gateways`), none importing another; above those `tianjictl` (the `tianji` command) and
`topologies` (the emulation, which uses the API client, not the command). `tests/unit/test_layering.py` keeps it so.
"""

import warnings

# Debian's python3-ovs imports eventlet, which warns on import that it is deprecated: noise in every command's
# output that no user can act on (the agent and the cluster import ovs through this package first)
warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")
