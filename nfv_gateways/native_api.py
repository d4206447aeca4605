"""The native code's interface, read from its headers: the ctypes side of `nfv_gateways/native/include/`.

The C headers state the interface once. Functions marked `TJ_API` there are declared to ctypes from their
prototypes (argument and return types), and constants listed in `TJ_CONSTANTS` are read from the library at load
time (`tj_constants`), so nothing is retyped or mirrored by hand. Building is native/Makefile's job; `build(target)`
runs it for one library (make rebuilds only what is older than its sources and headers).
"""

from __future__ import annotations

import ctypes
import functools
import re
import shutil
import subprocess
from pathlib import Path

NATIVE = Path(__file__).parent / "native"
INCLUDE = NATIVE / "include"
HEADERS = ("tj_api.h", "tj_nat.h", "tj_lb.h", "tj_dp.h")

_SCALARS: dict[str, type | None] = {
    "void": None, "int": ctypes.c_int, "double": ctypes.c_double,
    "uint8_t": ctypes.c_uint8, "uint16_t": ctypes.c_uint16, "uint32_t": ctypes.c_uint32, "uint64_t": ctypes.c_uint64,
    "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64,
}
_PROTOTYPE = re.compile(r"TJ_API\s+([^;(]*?)\b(\w+)\s*\(([^)]*)\)\s*;", re.S)


class FastPathUnavailable(RuntimeError):
    pass


def ctype_of(decl: str) -> type | None:
    """A C type (as written in a prototype, parameter name removed) as ctypes sees it.

    Strings are c_char_p; every other pointer is c_void_p, which takes ctypes arrays, byref() and bytes alike."""
    t = " ".join(decl.replace("*", " * ").split())
    t = re.sub(r"\bconst\b\s*", "", t).strip()
    if "*" in t:
        return ctypes.c_char_p if t == "char *" else ctypes.c_void_p
    if t not in _SCALARS:
        raise ValueError(f"native_api: no ctypes type for C type {decl!r}: add it to _SCALARS")
    return _SCALARS[t]


def _drop_name(param: str) -> str:
    """`const uint32_t *eips` -> `const uint32_t *` (a parameter without a name is kept whole)."""
    param = param.strip()
    m = re.match(r"(.*?[\s*])(\w+)$", param)
    return m.group(1) if m and m.group(1).strip() not in ("", "const") else param


@functools.cache
def prototypes() -> dict[str, tuple[type | None, list[type | None]]]:
    """Every TJ_API function in the headers: name -> (restype, argtypes)."""
    out: dict[str, tuple[type | None, list[type | None]]] = {}
    for header in HEADERS:
        text = re.sub(r"/\*.*?\*/", " ", (INCLUDE / header).read_text(), flags=re.S)
        for ret, name, params in _PROTOTYPE.findall(text):
            args = [] if params.strip() in ("", "void") else [ctype_of(_drop_name(p)) for p in params.split(",")]
            out[name] = (ctype_of(ret), args)
    return out


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Declare to ctypes every TJ_API function this library exports."""
    for name, (restype, argtypes) in prototypes().items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            continue  # _nat_fp.so has no dp_* functions
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def constants(lib: ctypes.CDLL) -> dict[str, int]:
    """TJ_CONSTANTS, as the library was built with them."""
    names = ctypes.POINTER(ctypes.c_char_p)()
    values = ctypes.POINTER(ctypes.c_int64)()
    n = lib.tj_constants(ctypes.byref(names), ctypes.byref(values))
    return {names[i].decode(): values[i] for i in range(n)}


def counter_names(lib: ctypes.CDLL) -> tuple[str, ...]:
    """The packet loop's counters, in the order dp_stats writes them."""
    return tuple(lib.dp_counter_name(i).decode() for i in range(lib.dp_nstats()))


def build(target: str) -> Path:
    """`make -C native TARGET`: the library, rebuilt if a source or header is newer; FastPathUnavailable says why
    not (a missing compiler or development package)."""
    if shutil.which("make") is None or (shutil.which("gcc") or shutil.which("cc")) is None:
        raise FastPathUnavailable("no C compiler or make: apt-get install gcc make (or run `make setup`)")
    r = subprocess.run(["make", "--no-print-directory", "-C", str(NATIVE), target], capture_output=True, text=True)
    if r.returncode:
        lines = [ln for ln in (r.stdout + r.stderr).splitlines() if not ln.startswith("make")]
        raise FastPathUnavailable(f"building {target} failed: {' '.join(lines[-3:]).strip()[-500:]}")
    return NATIVE / target


def load(target: str) -> ctypes.CDLL:
    return declare(ctypes.CDLL(str(build(target))))


__all__ = ["FastPathUnavailable", "build", "constants", "counter_names", "ctype_of", "declare", "load",
           "prototypes"]
