"""The nat role's controller side: NAT gateways over EIPs, their SNAT and DNAT rules."""
