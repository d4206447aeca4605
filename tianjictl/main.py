"""`tianji`: one command line for every component."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from tianji.api_client import ApiFailure
from tianjictl.config import CONFIG_FILE, credentials

if TYPE_CHECKING:
    from tianji.api_client import Client
from tianjictl.names import SharedTyper
from tianjictl.output import CONFLICT, INVALID, NOT_ALLOWED, console, done, err, exit_code, fail, show  # noqa: F401 (shared)

# Help as click writes it (as git's and kubectl's read) for every command, the root's mode being theirs: rich's
# formatter imports its Markdown renderer, 60% of a `tianji --help` (bench/cli.py).
app = SharedTyper(no_args_is_help=True, rich_markup_mode=None,
                  help="Tianji: VPC networking for private GPU clouds. Every command takes -o table|json|yaml|value "
                       "and -c COLUMN, and resources by name or id; exit statuses: docs/cli.md.")

controller_app = SharedTyper(no_args_is_help=True, help="Run the central controller.")
app.add_typer(controller_app, name="controller")


@controller_app.command("serve")
def serve(host: str = typer.Option("127.0.0.1", help="address to listen on"),
          port: int = typer.Option(8080, help="TCP port"),
          state_dir: Path = typer.Option(None, envvar="TIANJI_STATE_DIR",
                                         help="holds the SQLite database and admin.token"),
          database_url: str = typer.Option(None, envvar="TIANJI_DATABASE_URL",
                                           help="postgresql+psycopg://... (default: SQLite in the state dir)"),
          host_down_after: float = typer.Option(None, help="seconds of heartbeat silence before a host is down"),
          workers: int = typer.Option(1, help="worker processes (PostgreSQL: use one per core)"),
          tls_cert: Path = typer.Option(None, envvar="TIANJI_TLS_CERT", help="the server's certificate (PEM)"),
          tls_key: Path = typer.Option(None, envvar="TIANJI_TLS_KEY", help="its private key (PEM)"),
          client_ca: Path = typer.Option(None, envvar="TIANJI_CLIENT_CA",
                                         help="verify client certificates against this CA; hosts' credentials "
                                              "then need a certificate naming the host (mutual TLS)"),
          insecure_http: bool = typer.Option(False, "--insecure-http",
                                             help="serve plain HTTP: every token crosses the network in clear"),
          log_level: str = typer.Option("info"),
          log_format: str = typer.Option("text", envvar="TIANJI_LOG_FORMAT",
                                         help="text, or json: one object per line with each request's id, "
                                              "credential and latency")) -> None:
    """Start the controller: REST API under /v1, OpenAPI at /docs. HTTPS with --tls-cert/--tls-key; plain HTTP
    only with --insecure-http. SIGHUP reloads the certificate (docs/security.md)."""
    import functools
    import logging

    import uvicorn

    from controller.app import create_app
    from controller.replicas import hold_sqlite
    from controller.serving import server_options
    from controller.settings import Settings
    from controller.tls import uvicorn_factory
    from tianji import logs

    if not tls_cert and not insecure_http:
        fail("give --tls-cert and --tls-key (HTTPS), or --insecure-http to serve tokens in clear (a lab only); "
             "`tianji pki init DIR` makes a CA and certificates")
    if tls_cert and insecure_http:
        fail("--insecure-http and --tls-cert contradict each other: give one")
    try:
        logs.setup(log_level, log_format)
    except ValueError as e:
        fail(f"--log-format: {e}")
    settings = Settings.from_env(state_dir=state_dir, database_url=database_url, host_down_after=host_down_after,
                                 tls_cert=tls_cert, tls_key=tls_key, client_ca=client_ca)
    lock = hold_sqlite(settings)  # noqa: F841 -- held (a second controller on this SQLite file is refused) until exit
    api = create_app(settings)  # migrates and creates the admin token once, before any worker starts
    where = settings.database_url.split("@")[-1] if settings.database_url else settings.url
    scheme = "https" if tls_cert else "http"
    console.print(f"tianji controller: {scheme}://{host}:{port}  database: {where}  state: {settings.state_dir}"
                  + (f"  workers: {workers}" if workers > 1 else "")
                  + ("  client certificates: required of hosts" if client_ca else ""))
    if insecure_http:
        logging.getLogger("tianji.controller").warning(
            "serving plain HTTP (--insecure-http): tokens cross the network in clear; give --tls-cert/--tls-key")
    options = server_options(settings.trusted_proxies)
    options["log_config"] = None  # uvicorn's loggers go to ours (tianji.logs: text or JSON)
    os.environ["TIANJI_LOG_LEVEL"], os.environ["TIANJI_LOG_FORMAT"] = log_level, log_format  # for workers
    if tls_cert:
        options["ssl_context_factory"] = functools.partial(uvicorn_factory, str(tls_cert), str(tls_key),
                                                           str(client_ca) if client_ca else None)
    if workers > 1:
        os.environ["TIANJI_STATE_DIR"] = str(settings.state_dir)
        for var, val in (("DATABASE_URL", settings.database_url), ("HOST_DOWN_AFTER", host_down_after),
                         ("TLS_CERT", tls_cert), ("TLS_KEY", tls_key), ("CLIENT_CA", client_ca)):
            if val is not None:
                os.environ[f"TIANJI_{var}"] = str(val)
        uvicorn.run("controller.app:app_from_env", factory=True, workers=workers, host=host, port=port,
                    log_level=log_level.lower(), timeout_graceful_shutdown=2, **options)
    else:
        uvicorn.run(api, host=host, port=port, log_level=log_level.lower(), timeout_graceful_shutdown=2,
                    **options)


STATE_DIR = typer.Option(None, envvar="TIANJI_STATE_DIR", help="the controller's state directory (its SQLite "
                         "database, admin.token)")
DATABASE_URL = typer.Option(None, envvar="TIANJI_DATABASE_URL", help="postgresql+psycopg://... (default: SQLite in the "
                            "state dir)")


@controller_app.command("backup")
def backup(file: Path = typer.Argument(..., help="the backup file to write (a gzipped tar; replaced whole)"),
           state_dir: Path = STATE_DIR, database_url: str = DATABASE_URL) -> None:
    """Copy the controller's state into FILE while it serves: SQLite by its online backup, PostgreSQL by pg_dump in
    the snapshot that read the revision (docs/operations.md)."""
    from controller.settings import Settings
    from controller.state.backup import BackupError
    from controller.state.backup import backup as take

    settings = Settings.from_env(state_dir=state_dir, database_url=database_url)
    try:
        mf = take(settings.url, file, lambda line: err.print(line, highlight=False))
    except BackupError as e:
        fail(str(e))
        return
    counts = ", ".join(f"{n} {k}" for k, n in mf.counts.items())
    console.print(f"backed up revision {mf.revision} ({mf.backend}, schema {mf.schema}) to {file}: {counts}",
                  highlight=False)


@controller_app.command("restore")
def restore(file: Path = typer.Argument(..., exists=True, dir_okay=False, help="a backup `tianji controller "
                                                                                  "backup` wrote"),
            state_dir: Path = STATE_DIR, database_url: str = DATABASE_URL,
            revision_floor: int = typer.Option(0, min=0, help="the restored revision starts above this: when the "
                                               "database it replaces is lost, the highest revision agents may hold "
                                               "(their status shows it)")) -> None:
    """Replace the controller's state by FILE's, with every controller stopped. What it replaces is kept in the
    state directory; agents and gateway instances then take their configs from it once (docs/operations.md)."""
    from controller.settings import Settings
    from controller.state.backup import BackupError
    from controller.state.backup import restore as put_back

    settings = Settings.from_env(state_dir=state_dir, database_url=database_url)
    try:
        r = put_back(settings.url, file, settings.state_dir, revision_floor,
                     lambda line: err.print(line, highlight=False))
    except BackupError as e:
        fail(str(e), CONFLICT if "stop" in str(e) else INVALID)
        return
    console.print(f"restored revision {r.manifest.revision} of {r.manifest.created_at} as revision {r.revision}"
                  + (f"; the replaced state is in {r.kept}" if r.kept else ""), highlight=False)
    for what, items in (("VNIs", r.quarantined_vnis), ("EIPs", r.quarantined_eips)):
        if items:
            console.print(f"{len(items)} {what} handed out after the backup rest in quarantine: "
                          f"{', '.join(map(str, items[:10]))}{' ...' if len(items) > 10 else ''}", highlight=False)
    if r.removed_hosts:
        console.print(f"{len(r.removed_hosts)} host(s) registered after the backup are unknown again (their agents "
                      f"register anew with a new host token): {', '.join(r.removed_hosts[:10])}", highlight=False)


# --- API client commands ------------------------------------------------------------------------------

class Ctx:
    def __init__(self, url: str, token: str | None, as_json: bool, ca: str | None = None) -> None:
        self.url, self.token, self.ca = url, token, ca
        self.output = "json" if as_json else "table"  # -o on each command sets it (tianjictl/names.py)
        self.columns: tuple[str, ...] = ()
        self.long = False  # --long: ids in tables, not names (tianjictl/refnames.py)
        self._client: Client | None = None  # one per command: its requests share a connection

    @property
    def as_json(self) -> bool:
        return self.output == "json"

    def client(self) -> Client:
        from tianji.api_client import Client
        from tianji.tls import ClientTls

        if self._client is not None:
            return self._client
        if not self.token:
            fail("no token: pass --token, set TIANJI_TOKEN, or save one with `tianji login`", NOT_ALLOWED)
        try:
            self._client = Client(self.url, self.token, tls=ClientTls.from_env(self.ca))
            return self._client
        except ValueError as e:
            fail(f"--url: {e}", INVALID)
            raise


@app.callback()
def main_options(ctx: typer.Context,
                 url: str = typer.Option(None, "--url", "--controller", envvar="TIANJI_URL",
                                         help="controller URL (several replicas: URL,URL,...)"),
                 token: str = typer.Option(None, envvar="TIANJI_TOKEN", help="bearer token"),
                 ca: str = typer.Option(None, envvar="TIANJI_CA",
                                        help="verify the controller against this CA (default: the system's)"),
                 as_json: bool = typer.Option(False, "--json", help="print JSON instead of tables")) -> None:
    url, token, ca, admin = credentials(url, token, ca)
    # never the admin without saying so (the exported state dir is not a credential); the controller's own commands
    # use no credential
    if admin is not None and ctx.invoked_subcommand != "controller":
        err.print(f"[yellow]note:[/yellow] acting as the admin, with {admin} (TIANJI_STATE_DIR); give --token "
                  "or TIANJI_TOKEN to act as another credential", highlight=False, soft_wrap=True)
    ctx.obj = Ctx(url or "https://127.0.0.1:8080", token, as_json, ca)


def call(ctx: typer.Context, method: str, path: str, body: Any = None, **params: Any) -> Any:
    """One API call; a list comes whole (its pages followed). A refusal exits with its status (output.py)."""
    try:
        client = ctx.obj.client()
        if method == "GET" and "limit" not in params:
            return client.get(path, **params)
        return client.request(method, path, body, **params)
    except ApiFailure as e:
        fail(said(ctx, e) if e.status else e.detail, exit_code(e.status), e.status or None, e.field)


def said(ctx: typer.Context, e: ApiFailure) -> str:
    """The controller's refusal in the command's own words: the option that carried the field it names (`--ip`,
    `--accepter`; an argument by what it is), without pydantic's "Value error," or the request body's field."""
    detail = e.detail
    for prefix in (f"{e.field}: " if e.field else None, "body: ", "Value error, "):
        if prefix and detail.startswith(prefix):
            detail = detail[len(prefix):]
    if not e.field or e.field == "body":
        return detail
    return f"{option_for(ctx, e.field)}: {detail}"


def option_for(ctx: typer.Context, field: str) -> str:
    """The option (or argument) of the running command that a request field came from; else the field's name."""
    stem = field.removesuffix("_ids").removesuffix("_id")
    wanted = (field, stem, stem.removesuffix("_vpc"), stem.rsplit("_", 1)[-1])
    params = getattr(ctx.command, "params", [])
    for name in wanted:
        for p in params:
            if p.name == name:
                long_opts = [o for o in p.opts if o.startswith("--")]
                return long_opts[0] if long_opts else p.name.removesuffix("_id").replace("_", " ")
    return field


@app.command("login")
def login(url: str = typer.Option(...), token: str = typer.Option(...),
          ca: str = typer.Option(None, envvar="TIANJI_CA", help="the CA the controller's certificate is from")) -> None:
    """Save the controller URL, a token and the CA for later commands (~/.config/tianji/cli.json, mode 0600)."""
    from tianji.api_client import Client
    from tianji.tls import ClientTls

    try:
        Client(url, token, tls=ClientTls.from_env(ca)).get("/v1/whoami")
    except ApiFailure as e:
        fail(e.detail)
    CONFIG_FILE.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(CONFIG_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": url, "token": token} | ({"ca": str(Path(ca).resolve())} if ca else {}), f)
    console.print(f"saved to {CONFIG_FILE}")


def resource(name: str, help_: str) -> typer.Typer:
    sub = SharedTyper(no_args_is_help=True, help=help_, group=name)
    app.add_typer(sub, name=name)
    return sub


_REGISTERED: list[bool] = []


# the components' command groups: (module, its Typer, the help `tianji --help` shows without importing it)
COMPONENTS = {
    "agent": ("vswitch_agent.cli", "agent_app", "The vSwitch agent (one per hypervisor).", "the agent's"),
    "gateway": ("nfv_gateways.cli", "gateway_app", "NFV gateway instances (roles: nat, lb, private-line, service).",
                "the gateway's"),
    "cluster": ("topologies.cli", "cluster_app", "Emulated cluster: hypervisors with OVS + agent, VMs.",
                "Mininet (apt-get install mininet) or the cluster's"),
}


def _register_components(argv: list[str] | None = None) -> None:
    """The API commands, then the components. With `argv` (the command line), a component (os-ken, pyroute2, OVS,
    Mininet behind it: half a second) is imported only when it names it, or for shell completion; otherwise
    `--help` lists it from its help line alone. Without, all of them. Once."""
    if _REGISTERED:
        return
    _REGISTERED.append(True)
    import importlib

    import tianjictl.admin
    import tianjictl.labels
    import tianjictl.lb
    import tianjictl.lines
    import tianjictl.network
    import tianjictl.pki
    import tianjictl.services
    import tianjictl.trace  # noqa: F401 - their commands register on `app` as they are imported
    from tianjictl import param_help

    words = set(COMPONENTS if argv is None else argv)
    completing = any(k.startswith("_TIANJI_COMPLETE") for k in os.environ)
    for name, (module, attr, help_, needs) in COMPONENTS.items():
        if name not in words and not completing:
            app.add_typer(typer.Typer(help=help_), name=name)
            continue
        try:
            app.add_typer(getattr(importlib.import_module(module), attr), name=name)
        except ImportError as e:  # pragma: no cover - only where a component's dependencies are missing
            err.print(f"[yellow]note:[/yellow] `tianji {name}` unavailable: {e} ({needs} dependencies)")
    param_help.fill(app)


GLOBAL_VALUED = ("--url", "--controller", "--token", "--ca")  # the global options that take a value


def _only_the_command_asked(argv: list[str]) -> None:
    """Build only the command group the command line names (typer builds every command it holds, ~30 ms for them
    all): `tianji --help` and completion still see everything."""
    if any(k.startswith("_TIANJI_COMPLETE") for k in os.environ):
        return
    first, value_next = None, False
    for w in argv:
        if value_next or w.startswith("-"):
            value_next = w in GLOBAL_VALUED
            continue
        first = w
        break
    names = {g.name for g in app.registered_groups} | {c.name for c in app.registered_commands}
    if first in names:
        app.registered_groups = [g for g in app.registered_groups if g.name == first]
        app.registered_commands = [c for c in app.registered_commands if c.name == first]
    elif first is None:  # `tianji --help`: the groups' help lines, not their commands
        for g in app.registered_groups:
            if g.typer_instance is not None:
                g.typer_instance = typer.Typer(help=g.help or g.typer_instance.info.help)


def main() -> None:
    _register_components(sys.argv[1:])
    _only_the_command_asked(sys.argv[1:])
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
