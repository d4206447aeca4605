"""Commands in a named network namespace, run the one way every component, lab and bench runs them: `ip netns exec`,
which also gives the command a mount namespace with /etc/netns/NAME bound over /etc (a namespace's own
resolv.conf). topologies/netns.py builds the namespaces and links on top of this."""

from __future__ import annotations

import subprocess
from typing import Any


def argv(ns: str | None, *cmd: str) -> list[str]:
    """`cmd` as run in namespace `ns` (None: where we are)."""
    return ["ip", "netns", "exec", ns, *cmd] if ns else list(cmd)


def sh(*cmd: str, ns: str | None = None, check: bool = True, env: dict | None = None,
       timeout: float = 30) -> subprocess.CompletedProcess:
    """`cmd` (in namespace `ns`), its output captured as text; with `check`, a failure raises RuntimeError naming
    the command and its error."""
    full = argv(ns, *cmd)
    r = subprocess.run(full, capture_output=True, text=True, env=env, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(full)} failed: {r.stderr.strip() or r.stdout.strip()}")
    return r


def popen(*cmd: str, ns: str | None = None, **kw: Any) -> subprocess.Popen:
    """`cmd` started in namespace `ns`, with Popen's own keywords."""
    return subprocess.Popen(argv(ns, *cmd), **kw)
