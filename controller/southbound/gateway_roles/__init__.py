"""The gateway roles' rooms on the controller's side: one module per role (`nat`, `lb`, `line`, `service`) that
compiles what an instance of that role serves, as sections of its config (one per VPC), and its placement over the
role's live instances; `role.py` says what a role gives the gateway compiler (`RoleCompiler`), `registry.py` lists
them (the controller's counterpart of the gateway's `nfv_gateways/core/role.py` ROLES).

A role room may import the controller's ground (models, reads, fragments, placement, the hosts' compiler for the
fragments it shares) and `tianji`; the gateway compiler (`controller/southbound/gateway_compiler.py`) imports
the registry, and nothing here imports it back.
"""
