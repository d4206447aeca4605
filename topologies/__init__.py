"""Emulated clusters: hypervisors (each with a private Open vSwitch and a tianji agent) and VMs in netns."""
