"""How every `tianji` command answers: `-o table|json|yaml|value` and `-c COLUMN` (on every command), results and
errors alike in the format asked for, and an exit status that says what went wrong (docs/cli.md):

  0 done   1 other error (the controller failed)   2 invalid input   3 not found   4 conflict (or quota)
  5 not allowed (no or wrong token, or the credential may not)   6 controller unreachable   7 rate limited
  8 `tianji trace`: the destination is unreachable
"""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

OK, ERROR, INVALID, NOT_FOUND, CONFLICT, NOT_ALLOWED, UNREACHABLE, RATE_LIMITED, TRACE_UNREACHABLE = range(9)
FORMATS = ("table", "json", "yaml", "value")

console = Console(width=None if sys.stdout.isatty() else 200, emoji=False)  # ":100:" in an IPv6 address is not an emoji
err = Console(stderr=True, emoji=False)


def exit_code(status: int) -> int:
    """The exit status for an API answer's HTTP status (0: the controller was not reached)."""
    if status == 0:
        return UNREACHABLE
    return {400: INVALID, 401: NOT_ALLOWED, 403: NOT_ALLOWED, 404: NOT_FOUND, 409: CONFLICT, 413: INVALID,
            422: INVALID, 429: RATE_LIMITED}.get(status, ERROR)


ACTIVE: Any = None  # the running command's options (tianjictl.main.Ctx), set as it starts (names.py)


def output_format() -> str:
    return getattr(ACTIVE, "output", "table")


def fail(msg: str, code: int = ERROR, status: int | None = None, field: str | None = None) -> None:
    """Say the error (as JSON or YAML when that is the output asked for) and exit with `code`."""
    fmt = output_format()
    if fmt in ("json", "yaml"):
        problem = {"error": {"message": msg, "exit_code": code} | ({"status": status} if status else {})
                   | ({"field": field} if field else {})}
        err.print(json.dumps(problem) if fmt == "json" else _yaml(problem), highlight=False, markup=False,
                  soft_wrap=True)
    else:
        err.print(f"[red]error:[/red] {msg}", highlight=False)
    raise typer.Exit(code)


def _yaml(data: Any) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True).rstrip()


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, list):
        return ", ".join(map(str, v))
    return str(v)


def show(ctx: typer.Context, rows: Any, columns: list[str], title: str | None = None) -> None:
    """Print a result: one object or a list of them, with `columns` as a table's (or those given with -c)."""
    o = ctx.obj
    picked = list(o.columns) if o.columns else None
    if picked and (bad := [c for c in picked if not any(c in r for r in (rows if isinstance(rows, list) else [rows])
                                                       if isinstance(r, dict))]) and rows:
        fail(f"-c {bad[0]}: no such column; this command has {', '.join(columns)}", INVALID)
    cols = picked or columns
    if o.output in ("json", "yaml"):
        data = rows
        if picked:
            data = [{c: r.get(c) for c in cols} for r in rows] if isinstance(rows, list) else \
                {c: rows.get(c) for c in cols}
        console.print(json.dumps(data, indent=2, default=str) if o.output == "json" else _yaml(data),
                      highlight=False, markup=False, soft_wrap=True)
        return
    items = rows if isinstance(rows, list) else [rows]
    if o.output == "value":
        for r in items:
            console.print(" ".join(_cell(r.get(c)) for c in cols), highlight=False, markup=False, soft_wrap=True)
        return
    headers = cols
    if not picked and not getattr(o, "long", False) and items and hasattr(o, "client"):
        from tianjictl.refnames import by_name

        items, cols, headers = by_name(items, cols, o.client())
    t = Table(title=title, header_style="bold cyan")
    for h in headers:
        t.add_column(h, overflow="fold")
    for r in items:
        t.add_row(*(_cell(r.get(c)) for c in cols))
    console.print(t)


def done(ctx: typer.Context, message: str, **data: Any) -> None:
    """Say what a command did (a deletion, a revocation): `data` in JSON/YAML, its first value with -o value."""
    fmt = ctx.obj.output
    if fmt in ("json", "yaml"):
        console.print(json.dumps(data) if fmt == "json" else _yaml(data), highlight=False, markup=False)
    elif fmt == "value":
        console.print(str(next(iter(data.values()), "")), highlight=False, markup=False)
    else:
        console.print(message, highlight=False)
