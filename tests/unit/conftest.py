"""Fixtures the unit tests share."""

from __future__ import annotations

import ctypes

import pytest

from nfv_gateways.native.api import NATIVE
from nfv_gateways.native.dataplane import load


@pytest.fixture(scope="module")
def xdp() -> ctypes.CDLL:
    """The xdp backend's library, whose dp_xdp_test runs the XDP flow cache's program in the kernel."""
    lib = load("xdp")  # CI builds it (clang, libxdp): its absence is a failure here, not a skip
    assert (NATIVE / "_tj_xdp.o").exists(), "native/_tj_xdp.o is not built: make -C nfv_gateways/native _gw_xdp.so"
    return lib
