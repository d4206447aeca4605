"""The native interface is stated once, in the public headers, and read by a C parser (cffi's): ctypes
declarations, the structs that cross (their layout held to C's), and the constants come from there."""

from __future__ import annotations

import ctypes

import pytest

from nfv_gateways.native import api as native_api
from nfv_gateways.native.dataplane import EXT, PUNT_TRANSLATED, UL, lib_path
from nfv_gateways.native.dataplane import load as load_dataplane
from nfv_gateways.roles.nat.native import LIB, load


def test_prototypes_are_read_from_the_headers() -> None:
    load_dataplane("packet")
    p = native_api.prototypes(lib_path("packet"))
    restype, args = p["nat_del"]
    assert restype is ctypes.c_int
    assert args == [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint16, ctypes.c_uint8,
                    ctypes.c_double]
    assert p["dp_error"] == (ctypes.c_char_p, [ctypes.c_void_p])
    assert p["dp_nstats"] == (ctypes.c_uint32, [])
    assert p["dp_create"] == (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32])
    assert p["nat_set_vpc"] == (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p])  # a struct, by pointer


def test_every_declared_function_is_exported_by_its_library() -> None:
    nat, lb, dp = load(), native_api.load("_lb.so"), load_dataplane("packet")
    declared = native_api.declared_functions()
    assert {"nat_set_vpc", "dp_set_vpc", "dp_set_lb_vpc", "maglev_build", "tj_constants"} <= declared
    assert "nat_lock" not in declared and "lb_pick_locked" not in declared  # the loop's own, in private headers
    for name in declared:
        assert hasattr(dp, name), f"{name} is declared in a header but not exported by _gw_packet.so"
        assert getattr(dp, name).argtypes is not None
        if name.startswith("nat_"):
            assert hasattr(nat, name), f"{name} is declared in a header but not exported by {LIB}"
        if name.startswith(("maglev_", "lb_")):
            assert hasattr(lb, name), f"{name} is declared in a header but not exported by _lb.so"


def test_structs_are_laid_out_as_c_lays_them_out() -> None:
    f = native_api.ffi()
    for name in ("tj_nat_vpc_t", "tj_snat_rule_t", "tj_static_eip_t", "tj_dnat_rule_t", "tj_endpoint_t",
                 "tj_lb_listener_t", "tj_lb_member_t", "tj_nat_mapping_t"):
        cls, t = native_api.structure(name), f.typeof(name)
        assert ctypes.sizeof(cls) == f.sizeof(t)
        assert [(n, getattr(cls, n).offset) for n, _ in cls._fields_] == [(n, fld.offset) for n, fld in t.fields]
    assert f.sizeof("tj_nat_mapping_t") == 56  # what crosses per mapping read or written


def test_constants_and_counter_names_come_from_the_library() -> None:
    lib = load_dataplane("packet")
    k = native_api.constants(lib)
    assert (k["DP_UL"], k["DP_EXT"], k["DP_PUNT_TRANSLATED"]) == (UL, EXT, PUNT_TRANSLATED)
    assert k["NAT_MISS"] == 0 and {"NAT_OUT", "NAT_IN", "NAT_MAX_PEERS", "DP_SLOT", "DP_BURST"} <= set(k)
    assert k == native_api.header_constants()  # the library was built from these headers
    names = native_api.counter_names(lib)
    assert len(names) == lib.dp_nstats() == len(set(names))
    assert {"rx_ul", "fast_out", "fast_in", "punt", "drop_malformed", "tx_err"} <= set(names)
    assert native_api.constants(load()) == k  # one table, in every library


def test_an_unknown_c_type_is_refused_with_what_to_do() -> None:
    f = native_api.ffi()
    with pytest.raises(ValueError, match="_PRIMITIVES"):
        native_api.ctype_of(f.typeof("float"))
    assert native_api.ctype_of(f.typeof("const char *")) is ctypes.c_char_p
    assert native_api.ctype_of(f.typeof("const uint32_t *")) is ctypes.c_void_p


def test_a_failed_build_says_why() -> None:
    with pytest.raises(native_api.FastPathUnavailable, match="_gw_nosuch.so"):
        native_api.build("_gw_nosuch.so")
