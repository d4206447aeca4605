"""The controller's southbound side: what hosts and gateway instances are told and when. The compilers (a host's
config in `compiler.py`, a gateway instance's in `gateway_compiler.py` with each role's sections in
`gateway_roles/`), the fragments they cache, the deltas and patches the streams send, the
batched stream compiles (`stream_hub.py`), the wake-ups (`watch.py`), and liveness (`liveness.py`: beats and the
silence that marks a host down; `open_streams.py`: the streams whose TCP acknowledgements are beats), with
placement (which instance homes what).

It imports `controller.state`, `tianji` and the controller's leaves (`auth`, `errors`, `serving`, `settings`),
never `controller.api`: the HTTP routes that serve it (`api/hosts.py`, `api/host_stream.py`, `api/gateways.py`)
live with the other routes and call into it.
"""
