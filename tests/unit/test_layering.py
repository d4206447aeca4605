"""The import graph points downward only: the southbound schema below every component, the components beside
each other without importing one another, the CLI and the emulated cluster above (see `tianji/__init__.py`)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ("controller", "vswitch_agent", "nfv_gateways")
BELOW = ("tianji.inet", "tianji.primes", "tianji.ratelimit", "tianji.southbound", "tianji.southbound_client",
         "tianji.statusfile")
ABOVE = ("tianji.cli", "tianji.cli_admin", "tianji.cli_network", "tianji.cli_lb", "topologies", "tests", "bench")


def imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def first_party(name: str) -> str | None:
    for layer in (*BELOW, *ABOVE, *COMPONENTS):
        if name == layer or name.startswith(layer + "."):
            return layer
    return None


def edges(package: str) -> dict[str, set[str]]:
    files = [ROOT / f"{package}.py"] if (ROOT / f"{package}.py").exists() else \
        sorted((ROOT / package.replace(".", "/")).rglob("*.py"))
    if package in BELOW or package == "tianji.cli":
        files = [ROOT / (package.replace(".", "/") + ".py")]
    return {str(f.relative_to(ROOT)): {t for i in imports(f) if (t := first_party(i)) is not None} for f in files}


def test_components_import_only_what_is_below_them() -> None:
    bad = []
    for comp in COMPONENTS:
        for f, targets in edges(comp).items():
            bad += [f"{f} imports {t}" for t in targets if t not in (comp, *BELOW)]
    assert bad == [], "upward or sideways imports:\n" + "\n".join(bad)


def test_the_southbound_layer_imports_no_component() -> None:
    bad = []
    for mod in BELOW:
        for f, targets in edges(mod).items():
            bad += [f"{f} imports {t}" for t in targets if t not in BELOW]
    assert bad == [], "\n".join(bad)
