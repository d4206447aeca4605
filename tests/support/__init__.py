"""Test support shared by the tests and the benches: a served controller, PostgreSQL databases, the OpenFlow
table model (`ofsim`)."""
