"""Tianji vSwitch agent: keeps one hypervisor's Open vSwitch in line with the controller."""

import tianji  # noqa: F401 -- first: its warning filters, before anything imports ovs
