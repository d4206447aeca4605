"""The controller's southbound side: what hosts and gateway instances are told and when. The compilers (a host's
config in `compiler.py`, a gateway instance's in `gateway_compiler.py`, each role's sections compiled in its
room, `controller/roles/<role>/sections.py`), the fragments they cache, the deltas and patches the streams send, the
batched stream compiles (`stream_hub.py`), the wake-ups (`watch.py`), and liveness (`liveness.py`: beats and the
silence that marks a host down; `open_streams.py`: the streams whose TCP acknowledgements are beats), with
placement (which instance homes what).

It imports `controller.state`, `tianji`, the controller's leaves (`auth`, `errors`, `serving`, `settings`) and
the roles' southbound floor (`controller/roles/`: `registry.py`, `role.py`, each room's `sections.py`), never
`controller.api` nor a role's routes: the HTTP routes that serve it (`api/hosts.py`, `api/host_stream.py`,
`api/gateways.py`) live with the other routes and call into it.
"""
