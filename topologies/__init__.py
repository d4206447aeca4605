"""Emulated clusters: hypervisors (each with a private Open vSwitch and a tianji agent) and VMs in netns."""

import tianji  # noqa: F401 -- first: its warning filters, before anything imports ovs
