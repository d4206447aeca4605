"""Small modules and short functions, checked: no module over 400 lines in the shipped packages, no function over
60 lines in the components (ruff's C901 bounds their complexity at 15; see pyproject.toml)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("controller", "vswitch_agent", "nfv_gateways", "tianji", "topologies")
COMPONENTS = ("controller", "vswitch_agent", "nfv_gateways")
MAX_MODULE, MAX_FUNCTION = 400, 60


def sources(packages: tuple[str, ...]) -> list[Path]:
    return [p for pkg in packages for p in sorted((ROOT / pkg).rglob("*.py")) if "migrations" not in p.parts]


def test_no_module_is_over_400_lines() -> None:
    long = [f"{p.relative_to(ROOT)}: {n}" for p in sources(PACKAGES)
            if (n := len(p.read_text().splitlines())) > MAX_MODULE]
    assert long == [], "split these modules:\n" + "\n".join(long)


def test_no_component_function_is_over_60_lines() -> None:
    long = []
    for p in sources(COMPONENTS):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION:
                    long.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines")
    assert long == [], "split these functions:\n" + "\n".join(long)


def test_namespaces_and_veths_are_made_by_the_one_toolkit() -> None:
    """`topologies/netns.py` makes every namespace and veth pair (labs, fabrics, benches): nobody else runs
    `ip netns add` or `ip link add ... type veth`."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    pattern = re.compile(r'"netns",\s*"add"|"type",\s*"veth"')
    offenders = [str(f.relative_to(root)) for d in ("topologies", "bench", "tests", "tianjictl", "controller",
                                                     "vswitch_agent", "nfv_gateways")
                 for f in (root / d).rglob("*.py")
                 if f.name != "test_code_shape.py" and f != root / "topologies" / "netns.py"
                 and pattern.search(f.read_text())]
    assert offenders == [], f"make namespaces and veths with topologies.netns: {offenders}"


def test_shipped_code_enters_namespaces_through_the_one_toolkit() -> None:
    """What ships (the components, the command, the CNI plugin, the emulation) runs a command in a namespace with
    `tianji.netns` (argv, sh, popen): nobody else spells `ip netns exec`."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    pattern = re.compile(r'"netns",\s*"exec"')
    offenders = [str(f.relative_to(root)) for d in ("tianji", "tianji_cni", "tianjictl", "controller", "vswitch_agent",
                                                     "nfv_gateways", "topologies")
                 for f in (root / d).rglob("*.py")
                 if f != root / "tianji" / "netns.py" and pattern.search(f.read_text())]
    assert offenders == [], f"run commands in a namespace with tianji.netns: {offenders}"

