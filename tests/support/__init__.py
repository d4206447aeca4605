"""Test support shared by the tests and the benches: a served controller, PostgreSQL databases.
(The OpenFlow table model the unit tests walk flows with is product code: `vswitch_agent.ofmodel`, which the
reachability analyzer runs too.)"""
