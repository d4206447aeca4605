"""The native interface is stated once, in the headers: ctypes declarations and constants come from there."""

from __future__ import annotations

import ctypes

import pytest

from nfv_gateways import native_api
from nfv_gateways.dataplane import EXT, PUNT_TRANSLATED, UL
from nfv_gateways.dataplane import load as load_dataplane
from nfv_gateways.fastpath import LIB, load


def test_prototypes_are_read_from_the_headers() -> None:
    p = native_api.prototypes()
    restype, args = p["nat_put"]
    assert restype is ctypes.c_int
    assert args[:5] == [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint16, ctypes.c_uint8]
    assert args[-1] is ctypes.c_double and len(args) == 13
    assert p["dp_error"] == (ctypes.c_char_p, [ctypes.c_void_p])
    assert p["dp_nstats"] == (ctypes.c_uint32, [])
    assert p["dp_create"][0] is ctypes.c_void_p


def test_every_declared_function_is_exported_by_its_library() -> None:
    nat, lb, dp = load(), native_api.load("_lb.so"), load_dataplane("packet")
    for name in native_api.prototypes():
        assert hasattr(dp, name), f"{name} is declared in a header but not exported by _gw_packet.so"
        if name.startswith("nat_"):
            assert hasattr(nat, name), f"{name} is declared in a header but not exported by {LIB}"
        if name.startswith("maglev_"):
            assert hasattr(lb, name), f"{name} is declared in a header but not exported by _lb.so"
        assert getattr(dp, name).argtypes is not None or not native_api.prototypes()[name][1]


def test_constants_and_counter_names_come_from_the_library() -> None:
    lib = load_dataplane("packet")
    k = native_api.constants(lib)
    assert (k["DP_UL"], k["DP_EXT"], k["DP_PUNT_TRANSLATED"]) == (UL, EXT, PUNT_TRANSLATED)
    assert k["NAT_MISS"] == 0 and {"NAT_OUT", "NAT_IN", "NAT_MAX_PEERS", "DP_SLOT", "DP_BURST"} <= set(k)
    names = native_api.counter_names(lib)
    assert len(names) == lib.dp_nstats() == len(set(names))
    assert {"rx_ul", "fast_out", "fast_in", "punt", "drop_malformed", "tx_err"} <= set(names)
    assert native_api.constants(load()) == k  # one table, in every library


def test_an_unknown_c_type_is_refused_with_what_to_do() -> None:
    with pytest.raises(ValueError, match="_SCALARS"):
        native_api.ctype_of("struct timespec")
    assert native_api.ctype_of("const char *") is ctypes.c_char_p
    assert native_api.ctype_of("const uint32_t *") is ctypes.c_void_p


def test_a_failed_build_says_why() -> None:
    with pytest.raises(native_api.FastPathUnavailable, match="_gw_nosuch.so"):
        native_api.build("_gw_nosuch.so")
