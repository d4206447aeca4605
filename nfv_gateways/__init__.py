"""Tianji NFV gateways: gateway instances on gateway hosts, each a VTEP on the underlay serving one role, the NAT
gateway (`--role nat`) or the Maglev load balancer (`--role lb`), with its policy in Python (the reference) and its
packets on a native fast path in C behind ctypes (`native/`)."""
