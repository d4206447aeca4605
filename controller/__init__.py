"""Tianji's central controller, in rooms by concern, each importing only the rooms below it (held by
tests/unit/test_layering.py):

- `state/`: the tables, the database and its migrations, the global revision, and what a write records in its
  transaction (stamps, the change log, audit, idempotency keys);
- `southbound/`: what hosts and gateway instances are told (the compilers, deltas, the batched stream compiles,
  wake-ups) and whether they are alive (beats, open streams);
- `roles/`: one room per gateway role (NAT, load balancer, private line, service), its whole controller side: its
  tenant routes and schemas (the API's floor) and the sections its instances are told (southbound's floor);
- `reachability/`: the analyzer, over the compiled configs and the agent's own flow builders;
- `api/`: the HTTP routes (tenants', operators', hosts') with their schemas, EIPs, IPAM and quotas;
- here, the process around them: the app (`app.py`), settings, TLS, serving, auth and the request guards,
  idempotency, telemetry, replicas' leadership, OpenAPI and the console (`ui/`).
"""
