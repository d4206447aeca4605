"""The native code's interface, read from its headers: the ctypes side of `include/` beside this file.

The public headers (`PUBLIC`) state the interface once: every function Python calls (marked `TJ_API`), the structs
it passes, and the constants (`TJ_CONSTANTS`). They are run through the C preprocessor and cffi's C parser; from
what it parsed, every function of a library is declared to ctypes (argument and return types) and every struct
becomes a `ctypes.Structure` whose layout is checked against the parser's, field by field. Nothing is retyped or
mirrored by hand, and a library built from other headers than these is refused (its constants differ). Building
is native/Makefile's job; `build(target)` runs it for one library (make rebuilds what is older than its sources).
"""

from __future__ import annotations

import ctypes
import functools
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path
from typing import Any

NATIVE = Path(__file__).parent
INCLUDE = NATIVE / "include"
# what Python reads; the other headers are C's own
PUBLIC = ("tj_api.h", "tj_nat.h", "tj_lb.h", "tj_line.h", "tj_svc.h", "tj_dp.h")

_PRIMITIVES: dict[str, type] = {
    "int": ctypes.c_int, "unsigned int": ctypes.c_uint, "double": ctypes.c_double, "char": ctypes.c_char,
    "uint8_t": ctypes.c_uint8, "uint16_t": ctypes.c_uint16, "uint32_t": ctypes.c_uint32, "uint64_t": ctypes.c_uint64,
    "int8_t": ctypes.c_int8, "int16_t": ctypes.c_int16, "int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64,
}


class FastPathUnavailable(RuntimeError):
    pass


def carray(ctype: type, values: list[int]) -> ctypes.Array:
    """A C array of these values (never empty: C gets a valid pointer and the count says how many count)."""
    return (ctype * max(len(values), 1))(*values)


def preprocessed() -> str:
    """The public headers as the C preprocessor leaves them for a parser: TJ_API empty, <stdint.h> left to cffi
    (which knows its types), macros expanded."""
    with tempfile.TemporaryDirectory() as stubs:
        (Path(stubs) / "stdint.h").write_text("")
        src = "".join(f'#include "{h}"\n' for h in PUBLIC)
        r = subprocess.run(["gcc", "-E", "-P", "-nostdinc", f"-I{stubs}", f"-I{INCLUDE}", "-DTJ_API=", "-"],
                           input=src, capture_output=True, text=True)
    if r.returncode:
        raise FastPathUnavailable(f"the native headers do not preprocess: {r.stderr.strip()[-500:]}")
    return r.stdout


@functools.cache
def ffi() -> Any:
    """cffi's parse of the public headers."""
    import cffi

    f = cffi.FFI()
    f.cdef(preprocessed())
    return f


def ctype_of(t: Any) -> type | None:
    """A cffi type as ctypes sees it: strings are c_char_p; every other pointer is c_void_p (which takes ctypes
    arrays, structures by reference, byref() and bytes alike); structs their Structure."""
    if t.kind == "void":
        return None
    if t.kind == "primitive":
        if t.cname not in _PRIMITIVES:
            raise ValueError(f"native api: no ctypes type for C type {t.cname!r}: add it to _PRIMITIVES")
        return _PRIMITIVES[t.cname]
    if t.kind == "pointer":
        return ctypes.c_char_p if t.item.kind == "primitive" and t.item.cname == "char" else ctypes.c_void_p
    if t.kind == "array":
        return ctype_of(t.item) * t.length
    if t.kind == "struct":
        return structure(t.cname)
    raise ValueError(f"native api: {t.cname!r} ({t.kind}) cannot cross into C: pass it by pointer")


@functools.cache
def structure(name: str) -> type[ctypes.Structure]:
    """The ctypes Structure of a struct declared in the public headers, its layout held to the C parser's."""
    f = ffi()
    t = f.typeof(name)
    if t.kind != "struct":
        raise ValueError(f"native api: {name} is not a struct")
    fields = [(fname, ctype_of(fld.type)) for fname, fld in t.fields]
    cls = type(name, (ctypes.Structure,), {"_fields_": fields})
    for fname, fld in t.fields:
        if getattr(cls, fname).offset != fld.offset:
            raise FastPathUnavailable(f"native api: {name}.{fname} is at {getattr(cls, fname).offset} in ctypes, "
                                      f"{fld.offset} in C")
    if ctypes.sizeof(cls) != f.sizeof(t):
        raise FastPathUnavailable(f"native api: {name} is {ctypes.sizeof(cls)} bytes in ctypes, {f.sizeof(t)} in C")
    return cls


def prototypes(path: str | Path) -> dict[str, tuple[type | None, list[type | None]]]:
    """The functions the public headers declare that the library at `path` exports: name -> (restype,
    argtypes)."""
    f = ffi()
    lib = f.dlopen(str(path))
    out: dict[str, tuple[type | None, list[type | None]]] = {}
    for name in dir(lib):
        try:
            fn = getattr(lib, name)
        except AttributeError:
            continue  # declared, not in this library (_nat_fp.so has no dp_* functions)
        if isinstance(fn, int):
            continue  # a constant
        t = f.typeof(fn)
        out[name] = (ctype_of(t.result), [ctype_of(a) for a in t.args])
    return out


@functools.cache
def _declared() -> Any:
    """The headers' names, as cffi holds them (bound to no library: for the names and the constants)."""
    return ffi().dlopen(None)


def _value(lib: Any, name: str) -> Any:
    try:
        return getattr(lib, name)
    except AttributeError:
        return None


@functools.cache
def header_constants() -> dict[str, int]:
    """TJ_CONSTANTS as the headers state them."""
    lib = _declared()
    return {n: v for n in dir(lib) if isinstance(v := _value(lib, n), int)}


def declared_functions() -> set[str]:
    """Every function the public headers declare."""
    return set(dir(_declared())) - set(header_constants())


_FORMAT = {ctypes.c_uint8: "B", ctypes.c_uint16: "H", ctypes.c_uint32: "I", ctypes.c_uint64: "Q", ctypes.c_int8: "b",
           ctypes.c_int16: "h", ctypes.c_int32: "i", ctypes.c_int64: "q", ctypes.c_double: "d", ctypes.c_int: "i"}


def record_format(name: str) -> struct.Struct:
    """A struct of scalars from the headers as a `struct.Struct` (to unpack arrays of records fast), its size held
    to C's."""
    cls = structure(name)
    fmt = struct.Struct("@" + "".join(_FORMAT[t] for _, t in cls._fields_))
    if fmt.size != ctypes.sizeof(cls):
        raise FastPathUnavailable(f"native api: {name} unpacks to {fmt.size} bytes, C has {ctypes.sizeof(cls)}")
    return fmt


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Declare to ctypes every function of the public headers this library exports."""
    for name, (restype, argtypes) in prototypes(lib._name).items():
        fn = getattr(lib, name)
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
    """A native library, built if need be, every function declared; refused when it was built from other headers
    (its constants differ from theirs)."""
    lib = declare(ctypes.CDLL(str(build(target))))
    built, stated = constants(lib), header_constants()
    if stale := {k for k in built if stated.get(k) != built[k]}:
        raise FastPathUnavailable(f"{target} was built with other constants than its headers state "
                                  f"({', '.join(sorted(stale))}): rebuild it (make native)")
    return lib


__all__ = ["FastPathUnavailable", "build", "carray", "constants", "counter_names", "ctype_of", "declare", "ffi",
           "declared_functions", "header_constants", "load", "prototypes", "record_format", "structure"]
