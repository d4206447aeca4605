"""Tianji NFV gateways: NAT (this package's first role), load balancer and private line (later)."""
