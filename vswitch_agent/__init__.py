"""Tianji vSwitch agent: keeps one hypervisor's Open vSwitch in line with the controller."""
