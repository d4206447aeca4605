"""The NAT role: SNAT, 1:1 EIPs and DNAT per VPC (RFC 4787, 5382, 5508)."""
