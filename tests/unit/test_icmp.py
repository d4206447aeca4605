"""The distributed router's time-exceeded answers, checked with scapy; malformed input gives None."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from scapy.layers.inet import ICMP, IP, UDP, IPerror, UDPerror
from scapy.layers.l2 import Ether

from vswitch_agent.icmp import RateLimit, time_exceeded


def test_time_exceeded_quotes_the_datagram_and_comes_from_the_gateway() -> None:
    probe = Ether(src="02:00:00:00:00:01", dst="02:aa:00:00:00:01") / IP(src="10.0.1.5", dst="10.0.2.7", ttl=1) \
        / UDP(sport=40000, dport=33434) / (b"x" * 32)
    out = Ether(time_exceeded(bytes(probe), "02:aa:00:00:00:01", "10.0.1.1"))
    assert (out.src, out.dst) == ("02:aa:00:00:00:01", "02:00:00:00:00:01")
    assert (out[IP].src, out[IP].dst, out[ICMP].type, out[ICMP].code) == ("10.0.1.1", "10.0.1.5", 11, 0)
    again = out.copy()  # scapy recomputes the checksums: they must be the ones sent
    del again[IP].chksum, again[ICMP].chksum
    again = Ether(bytes(again))
    assert (out[IP].chksum, out[ICMP].chksum) == (again[IP].chksum, again[ICMP].chksum)
    assert out[IPerror].dst == "10.0.2.7" and out[UDPerror].dport == 33434


def test_no_answer_to_errors_fragments_or_garbage() -> None:
    err = Ether() / IP(src="10.0.1.5", dst="10.0.2.7", ttl=1) / ICMP(type=3, code=3)
    frag = Ether() / IP(src="10.0.1.5", dst="10.0.2.7", ttl=1, frag=100) / (b"x" * 20)
    for frame in (bytes(err), bytes(frag), b"", b"\x00" * 20, bytes(Ether() / b"abc")):
        assert time_exceeded(frame, "02:aa:00:00:00:01", "10.0.1.1") is None


@given(st.binary(max_size=200))
def test_any_bytes_never_raise(data: bytes) -> None:
    time_exceeded(b"\x02" * 12 + b"\x08\x00" + data, "02:aa:00:00:00:01", "10.0.1.1")


def test_rate_limit() -> None:
    r = RateLimit(rate=1, burst=5)
    assert sum(r.allow() for _ in range(50)) in (5, 6)
