"""Private-line placement (controller/southbound/placement.line_hosts) and the underlay's neighbours the agent
resolves."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from controller.southbound.placement import line_hosts
from vswitch_agent.underlay_neighbours import arp_request, cached

NAMES = st.lists(st.sampled_from([f"pl{i}" for i in range(6)]), min_size=0, max_size=6, unique=True)


@given(live=NAMES, sessions=st.integers(1, 2), placed=st.lists(st.sampled_from([None, "pl0", "pl1", "pl7"]),
                                                                max_size=2))
def test_a_session_stays_where_it_runs_while_its_instance_lives(live, sessions, placed) -> None:
    out = line_hosts("L", sessions, live, placed)
    assert len(out) == sessions
    for k, inst in enumerate(out):
        if not live:
            assert inst is None
            continue
        assert inst in live
        if k < len(placed) and placed[k] in live:
            assert inst == placed[k]  # sticky
    if len(live) >= 2 and sessions == 2 and not (len(placed) == 2 and placed[0] == placed[1] and placed[0] in live):
        assert out[0] != out[1]  # the redundant pair on two instances when it can be


@given(live=NAMES)
def test_with_nothing_placed_it_is_rendezvous_and_a_returning_instance_takes_nothing(live) -> None:
    fresh = line_hosts("L", 2, live)
    assert line_hosts("L", 2, live, fresh) == fresh
    if len(live) >= 2:
        dead = fresh[0]
        moved = line_hosts("L", 2, [x for x in live if x != dead], fresh)
        assert dead not in moved and moved[1] == fresh[1]
        assert line_hosts("L", 2, live, moved) == moved  # it came back: nothing moves back by itself


def test_the_arp_request_and_the_cache_as_ovs_shows_it() -> None:
    frame = arp_request(bytes.fromhex("020000000001"), "172.31.0.11", "172.31.0.107")
    assert frame[:6] == b"\xff" * 6 and frame[12:14] == b"\x08\x06" and len(frame) == 42
    assert frame[20:22] == b"\x00\x01" and frame[28:32] == bytes([172, 31, 0, 11]) and frame[38:] == bytes(
        [172, 31, 0, 107])
    show = ("IP                                            MAC                 Bridge\n" + "=" * 74 + "\n"
            "172.31.0.107                                  e6:f7:58:dc:38:0b   br-phy\n"
            "fe80::1                                       e6:f7:58:dc:38:0c   br-phy\n")
    assert cached(show) == {"172.31.0.107", "fe80::1"}
