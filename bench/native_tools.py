"""The benchmarks' C tools (bench/native/*.c): built with gcc on this machine, once, into the lab directory."""

from __future__ import annotations

import subprocess
from pathlib import Path

SOURCES = Path(__file__).parent / "native"
BUILT = Path("/run/tianji-lab")


def compiled(name: str) -> Path:
    """bench/native/NAME.c as an executable, rebuilt when missing or older than its source."""
    src, out = SOURCES / f"{name}.c", BUILT / name
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["gcc", "-O2", "-o", str(out), str(src)], capture_output=True, text=True, check=True)
    return out
