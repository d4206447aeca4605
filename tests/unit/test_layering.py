"""The import graph points downward only: the ground floor (`tianji`: the southbound contract and its client, small
helpers) below every component, the components beside each other without importing one another, the command and the
emulated cluster above (see `tianji/__init__.py`); and no module imports itself back through others at import time."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GROUND = "tianji"
COMPONENTS = ("controller", "vswitch_agent", "nfv_gateways")
ABOVE = ("tianjictl", "tianji_cni", "topologies", "tests", "bench")
PACKAGES = (GROUND, *COMPONENTS, "tianjictl", "tianji_cni", "topologies")


def imports(path: Path, top_level_only: bool = False) -> set[str]:
    """What `path` imports (with `top_level_only`, what it imports when it is imported: not inside functions, nor
    under `if TYPE_CHECKING`)."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = ast.walk(tree)
    if top_level_only:
        nodes = iter([n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
                     + [n for t in tree.body if isinstance(t, ast.Try) for n in t.body
                        if isinstance(n, ast.Import | ast.ImportFrom)])
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}  # `from pkg import module`
    return out


def layer_of(name: str) -> str | None:
    top = name.split(".")[0]
    return top if top in (GROUND, *COMPONENTS, *ABOVE) else None


def files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


# The one sideways door: the controller's reachability analyzer runs the agent's own flow builders in its OpenFlow
# model (one implementation of the rules, not two). These modules of the agent are pure: no I/O, no agent state.
TRANSLATION = {f"vswitch_agent.{m}" for m in ("flows", "flows6", "flow", "pipeline", "actions", "lb_flows", "openflow",
                                              "ofmodel", "model_host", "health")}
ANALYZER = "controller/reachability/"


def _translation(name: str) -> bool:
    return name == "vswitch_agent" or any(name == t or name.startswith(t + ".") for t in TRANSLATION)


def test_components_import_only_the_ground_floor_and_themselves() -> None:
    bad = [f"{f.relative_to(ROOT)} imports {i}" for comp in COMPONENTS for f in files(comp)
           for i in imports(f) if (t := layer_of(i)) is not None and t not in (comp, GROUND)
           and not (str(f.relative_to(ROOT)).startswith(ANALYZER) and _translation(i))]
    assert bad == [], "upward or sideways imports:\n" + "\n".join(sorted(bad))


def test_the_agents_translation_stays_pure() -> None:
    """What the analyzer borrows imports nothing else of the agent (its runtime: OVS, sockets, state)."""
    bad = [f"{module_name(f)} imports {i}" for f in files("vswitch_agent") if module_name(f) in TRANSLATION
           for i in imports(f) if i.startswith("vswitch_agent") and not _translation(i)]
    assert bad == [], "\n".join(sorted(bad))


def test_the_ground_floor_imports_nothing_above_it() -> None:
    bad = [f"{f.relative_to(ROOT)} imports {i}" for f in files(GROUND) for i in imports(f)
           if (t := layer_of(i)) is not None and t != GROUND]
    assert bad == [], "\n".join(sorted(bad))


def test_the_emulation_and_the_plugin_use_the_api_client_not_the_command() -> None:
    """`topologies` and `tianji_cni` speak the API through `tianji.api_client`; only the command imports the
    emulation (to register `tianji cluster`), never the other way round, not even inside a function."""
    bad = [f"{f.relative_to(ROOT)} imports {i}" for p in ("topologies", "tianji_cni") for f in files(p)
           for i in imports(f) if i.split(".")[0] == "tianjictl"]
    assert bad == [], "\n".join(sorted(bad))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_module_level_import_cycle() -> None:
    modules = {module_name(f): f for p in PACKAGES for f in files(p)}
    graph = {m: {i for i in imports(f, top_level_only=True) if i in modules and i != m} for m, f in modules.items()}
    # a module's package __init__ runs first when it is imported: an edge to the module is one to its parents too
    for m in list(graph):
        graph[m] |= {p for i in list(graph[m]) for p in _parents(i) if p in modules and p != m}
    cycles, state = [], dict.fromkeys(graph, 0)

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state[n] == 1:
                cycles.append(" -> ".join([*path[path.index(n):], n]))
            elif state[n] == 0:
                visit(n, [*path, n])
        state[m] = 2

    for m in sorted(graph):
        if state[m] == 0:
            visit(m, [m])
    assert cycles == [], "module-level import cycles:\n" + "\n".join(cycles)


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


ROLES_DIR = "controller/roles"
ROLE_API_FLOOR = {"routes", "schemas", "health"}  # a role room's tenant (and host report) routes and their bodies


def role_rooms() -> set[str]:
    return {d.name for d in (ROOT / ROLES_DIR).iterdir() if (d / "__init__.py").exists()}


def on_api_floor(name: str) -> bool:
    """`name` (a module) is part of the REST surface: `controller.api` or a role room's routes and schemas."""
    parts = name.split(".")
    return name.startswith("controller.api") or (
        name.startswith("controller.roles.") and len(parts) >= 4 and parts[3] in ROLE_API_FLOOR)


def test_every_gateway_role_has_its_room_and_the_rooms_keep_to_themselves() -> None:
    """Each role the hosts may have has one room under `controller/roles/` (its sections, routes and schemas),
    registered once; a room never imports another role's room, nor the gateway compiler (which dispatches through
    the registry)."""
    from controller.roles.registry import ROLES
    from tianji.southbound import GATEWAY_ROLES

    assert sorted(ROLES) == sorted(GATEWAY_ROLES)
    rooms = role_rooms()
    in_rooms = sorted(f"controller.roles.{r}.sections" for r in rooms)
    assert sorted(r.sections.__module__ for r in ROLES.values()) == in_rooms
    for r in rooms:
        assert (ROOT / ROLES_DIR / r / "sections.py").exists() and (ROOT / ROLES_DIR / r / "routes.py").exists(), r
    bad = [f"{f.relative_to(ROOT)} imports {i}" for r in rooms for f in files(f"{ROLES_DIR}/{r}")
           for i in imports(f) if i.startswith("controller.southbound.gateway_compiler")
           or any(i.startswith(f"controller.roles.{o}") for o in rooms - {r})]
    assert bad == [], "\n".join(bad)


CONTROLLER_LEAVES = {"controller.errors", "controller.failpoints", "controller.settings", "controller.tls",
                     "controller.serving", "controller.auth", "controller.telemetry"}
ROOM_MAY_IMPORT = {  # the controller's rooms, each with what of the controller it may import besides itself
    "controller.state": {"controller.errors", "controller.failpoints"},
    # the roles' southbound floor (their sections, role.py, registry.py) is part of it: see controller/roles/__init__
    "controller.southbound": {"controller.state", "controller.roles", *CONTROLLER_LEAVES},
    "controller.reachability": {"controller.state", "controller.southbound", *CONTROLLER_LEAVES},
}


def test_the_controllers_rooms_import_only_downward() -> None:
    """state below southbound below the API: what each room may import of the controller (see each room's
    `__init__.py`); a role room's sections stand on southbound's floor, its routes and schemas on the API's; the API
    imports anything below it and nothing imports the API but the app."""
    bad = []
    for room, allowed in ROOM_MAY_IMPORT.items():
        for f in files(room.replace(".", "/")):
            for i in imports(f):
                if i.startswith("controller.") and not i.startswith(room) \
                        and not any(i == a or i.startswith(a + ".") for a in allowed):
                    bad.append(f"{f.relative_to(ROOT)} imports {i}")
    for f in files(ROLES_DIR):  # a role's southbound floor: as southbound's
        if not on_api_floor(module_name(f)):
            bad += [f"{f.relative_to(ROOT)} imports {i}" for i in imports(f) if i.startswith("controller.")
                    and not any(i.startswith(a) for a in ("controller.roles", *ROOM_MAY_IMPORT["controller.southbound"],
                                                          "controller.southbound"))]
    for f in files("controller"):
        if not on_api_floor(module_name(f)) and f.name != "app.py":
            bad += [f"{f.relative_to(ROOT)} imports {i}" for i in imports(f) if on_api_floor(i)]
    assert bad == [], "imports across the controller's rooms that run back up:\n" + "\n".join(sorted(bad))


def test_no_import_circle_joins_files_of_different_packages() -> None:
    """Counting imports inside functions too: files that import each other, however indirectly, live in one
    package (a circle across packages is two concepts that cannot be understood apart)."""
    modules = {module_name(f): f for p in PACKAGES for f in files(p)}
    graph = {m: sorted(i for i in imports(f) if i in modules and i != m) for m, f in modules.items()}
    reach: dict[str, set[str]] = {}

    def reachable(m: str) -> set[str]:
        if m not in reach:
            seen, todo = set(), [m]
            while todo:
                for n in graph[todo.pop()]:
                    if n not in seen:
                        seen.add(n)
                        todo.append(n)
            reach[m] = seen
        return reach[m]

    def package(m: str) -> str:
        return m if modules[m].name == "__init__.py" else m.rsplit(".", 1)[0]

    bad = sorted({f"{a} <-> {b}" for a in graph for b in reachable(a)
                  if a < b and package(a) != package(b) and a in reachable(b)})
    assert bad == [], "import circles across packages:\n" + "\n".join(bad)
