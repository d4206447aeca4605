"""The gateway roles' rooms: each role's whole controller side in one folder (`nat/`, `lb/`, `line/`, `service/`),
the counterpart of the gateway's `nfv_gateways/roles/<role>/`.

A room holds, on two floors:
- the southbound floor: `sections.py` (the role's reads and the sections of an instance's config it compiles, one
  per VPC, over the role's live instances) and what placement the role keeps (`line/placement.py`). These may
  import `controller.state`, `controller.southbound` (fragments, placement, the hosts' compiler for the fragments
  it shares), `roles/role.py` and the controller's leaves; never the API's side of any room.
- the API floor: `routes.py` (the role's tenant REST routes, and its hosts' reports: `lb/health.py`) and
  `schemas.py` (their bodies). These may import anything below them and `controller.api` (common, schemas,
  quotas, the resources they build on: EIPs, ports, VPC routes); only the app imports them.

`role.py` says what a role gives the gateway compiler (`RoleCompiler`, `section_of`) and `registry.py` lists the
roles (`ROLES`, like the gateway's `nfv_gateways/core/role.py`); `controller/southbound/gateway_compiler.py`
dispatches through it. No room imports another role's room.
"""
