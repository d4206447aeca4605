"""New connections through the NAT's native paths on real interfaces (the lab of bench/nat_wire.py): its C generator
and responder at a rate every path carries, every connection from a new inner address and port, the whole TCP
exchange (SYN, SYN-ACK, ACK, FIN, FIN-ACK, ACK) or a UDP datagram and its echo through the gateway, and every
mapping made by the packet loop, none by Python. In CI every backend must start (`make setup` installs them)."""

from __future__ import annotations

import time

import pytest

from bench.nat_wire import NewConnLab

RATE, SECONDS = 5000, 1.0


@pytest.mark.parametrize("proto", ["tcp", "udp"])
@pytest.mark.parametrize("fastpath", ["dpdk", "xdp", "packet"])
def test_new_connections_are_made_in_c(fastpath: str, proto: str) -> None:
    lab = NewConnLab()
    try:
        lab.up("tianji", fastpath)
        assert lab.status()["fastpath"].split()[0] == fastpath
        lab.traffic_ends()
        time.sleep(0.5)
        before = lab.status()["nat_native"]
        established, closed, offered = (x * SECONDS for x in lab.run(proto, SECONDS, RATE))
        time.sleep(1.2)  # two status writes
        st = lab.status()
        after, dp = st["nat_native"], st["dataplane"]
        assert offered >= 0.95 * RATE * SECONDS, f"the generator offered only {offered:.0f}"
        assert established >= 0.99 * offered, f"{established:.0f} of {offered:.0f} came back through the gateway"
        if proto == "tcp":
            assert closed >= 0.99 * offered, f"{closed:.0f} of {offered:.0f} closed"
        assert after["created"] - before["created"] >= established, (after, before)
        # what reached Python: ARP and the like, not the flows (each of which would be one more punt)
        assert after["slow"] - before["slow"] < 0.01 * offered, (after, before, dp)
        assert st["mappings"] >= established
    finally:
        lab.down()
