"""The controller's HTTP routes under /v1: the tenants' REST surface (VPCs, subnets, ports, groups, peering, EIPs,
the analyzer), the operators' (tenants, EIP pools, hosts), and the routes hosts and gateway instances call
(`hosts.py`, `host_stream.py`, `gateways.py`), with their request and answer schemas (`*_schemas.py`), IPAM and
quotas. Each gateway role's routes (NAT gateways, load balancers, private lines, services) live in its room,
`controller/roles/<role>/routes.py`, on this floor.

It may import `controller.state`, `controller.southbound` (placement, the compilers the watches answer with), the
roles' southbound floor and the controller's leaves; nothing below it imports it.
"""
