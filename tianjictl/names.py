"""What every `tianji` command shares, given to each as it is declared (`SharedTyper.command`): `-o` and `-c`, a
help line, and resources by name or id wherever a command takes one (a parameter named for the resource:
`vpc_id`, `subnet_id`, `--sg`...). A name is looked up among what the caller sees; one that names several is
refused, naming the option; anything else goes to the controller as an id (its 404 names the field).
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from typing import Any

import typer
from typer.models import ArgumentInfo, OptionInfo

from tianjictl import output
from tianjictl.output import FORMATS, INVALID, fail

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# a parameter's name -> the collection its names are looked up in
REFS = {"vpc_id": "vpcs", "requester": "vpcs", "accepter": "vpcs", "subnet_id": "subnets", "port_id": "ports",
        "sg_id": "security-groups", "sg": "security-groups", "remote_group": "security-groups",
        "gw_id": "nat-gateways", "lb_id": "load-balancers", "line_id": "private-lines", "tenant_id": "tenants",
        "service_id": "services", "pool_id": "pools", "eip_id": "eips", "eips": "eips"}
VERBS = {"create": "Create {a}.", "list": "List {many}.", "show": "Show {a}.", "delete": "Delete {a}.",
         "update": "Change {a}.", "accept": "Accept {a}.", "reject": "Reject {a}.", "register": "Register {a}.",
         "associate": "Associate {a} with a port.", "disassociate": "Free {a} from its port."}
# how a group's resource is said (one, many); others: "a <group>", "<group>s"
SAID = {"vpc": ("a VPC", "VPCs"), "sg": ("a security group", "security groups"), "eip": ("an EIP", "EIPs"),
        "nat-gateway": ("a NAT gateway", "NAT gateways"), "lb": ("a load balancer", "load balancers"),
        "endpoint": ("a service endpoint", "service endpoints"), "private-line": ("a private line", "private lines")}


def resolver(collection: str) -> Callable[..., Any]:
    def resolve(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
        if value is None or ctx.resilient_parsing:
            return value
        if isinstance(value, list | tuple):
            return [_one(ctx, collection, v, param) for v in value]
        return _one(ctx, collection, value, param)

    return resolve


def _one(ctx: typer.Context, collection: str, value: str, param: typer.CallbackParam) -> str:
    if UUID.match(value) or ctx.obj is None or not value:
        return value
    from tianjictl.main import call

    if collection == "eips":  # an EIP is named by its address
        found = [e for e in call(ctx, "GET", "/v1/eips") if e["address"] == value]
    elif collection == "tenants":
        found = [t for t in call(ctx, "GET", "/v1/tenants") if t["name"] == value]
    else:
        found = call(ctx, "GET", f"/v1/{collection}", name=value)
    if len(found) > 1:
        opt = next((o for o in param.opts if o.startswith("--")), (param.name or "").removesuffix("_id"))
        listed = "; ".join(f"{f['id']}" + (f" ({f['cidr']})" if f.get("cidr") else "") for f in found)
        fail(f"{opt}: {len(found)} {collection.replace('-', ' ')} are named {value!r}: {listed}; give one's id",
             INVALID)
    return found[0]["id"] if found else value


def completer(collection: str) -> Callable[[str], list[str]]:
    """Shell completion of a resource's names, from the controller and with the credential the command line would
    use (config.credentials). Nothing when it cannot ask: completion never fails a shell."""

    def complete(incomplete: str) -> list[str]:
        import os

        from tianji.api_client import Client
        from tianji.tls import ClientTls
        from tianjictl.config import credentials

        url, token, ca, _ = credentials(*(os.environ.get(f"TIANJI_{v}") for v in ("URL", "TOKEN", "CA")))
        if not url or not token:
            return []
        try:
            rows = Client(url, token, timeout=3, tls=ClientTls.from_env(ca)).get(f"/v1/{collection}")
        except Exception:  # unreachable, refused, no token: no suggestions
            return []
        field = "address" if collection == "eips" else "name"
        return sorted({str(r[field]) for r in rows if str(r.get(field, "")).startswith(incomplete)})

    return complete


def _with_lookup(p: inspect.Parameter) -> inspect.Parameter:
    """`p` with its name looked up (a parameter named for a resource), and its names completed in the shell."""
    if p.name not in REFS:
        return p
    cb, complete = resolver(REFS[p.name]), completer(REFS[p.name])
    d = p.default
    if isinstance(d, OptionInfo | ArgumentInfo):
        if d.callback is None:
            d.callback = cb
            if d.help and " id" in d.help and "name" not in d.help:
                d.help = d.help.replace(" id", " name or id")
        if d.autocompletion is None:
            d.autocompletion = complete
        return p
    if d is inspect.Parameter.empty:
        return p.replace(default=typer.Argument(..., callback=cb, help=f"name or id ({p.name.removesuffix('_id')})",
                                                autocompletion=complete))
    return p.replace(default=typer.Option(d, callback=cb, autocompletion=complete))


SHARED = [
    inspect.Parameter("output_", inspect.Parameter.KEYWORD_ONLY, annotation=str | None,
                      default=typer.Option(None, "-o", "--output", help=f"{', '.join(FORMATS)} (default: table)",
                                           show_default=False)),
    inspect.Parameter("column_", inspect.Parameter.KEYWORD_ONLY, annotation=list[str] | None,
                      default=typer.Option(None, "-c", "--column", help="only this column (repeatable)")),
    inspect.Parameter("long_", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                      default=typer.Option(False, "--long", help="tables show ids where they show names")),
]


def shared(fn: Callable[..., Any], group: str, name: str | None = None) -> Callable[..., Any]:
    """`fn` as a command: the shared options taken (they set the context's output), names looked up."""
    sig = inspect.signature(fn)
    params = [_with_lookup(p) for p in sig.parameters.values()]
    has_ctx = any(p.name == "ctx" for p in params)
    if not has_ctx:
        params.insert(0, inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context))

    @functools.wraps(fn)
    def command(*args: Any, **kwargs: Any) -> Any:
        ctx, fmt, cols = kwargs.get("ctx"), kwargs.pop("output_", None), kwargs.pop("column_", None)
        long_ = kwargs.pop("long_", False)
        if ctx is not None and ctx.obj is not None:
            ctx.obj.long = long_
            if fmt is not None:
                if fmt not in FORMATS:
                    fail(f"-o {fmt}: give one of {', '.join(FORMATS)}", INVALID)
                ctx.obj.output = fmt
            ctx.obj.columns = tuple(cols or ())
            output.ACTIVE = ctx.obj
        if not has_ctx:
            kwargs.pop("ctx", None)
        return fn(*args, **kwargs)

    # keyword-only, in the order declared: typer passes every parameter by name, and a looked-up argument
    # (now with a default) may precede one without
    command.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params] + SHARED)
    if not (fn.__doc__ or "").strip() and name in VERBS:  # the plain verbs say themselves; others have docstrings
        one, many = SAID.get(group, (f"a {group.replace('-', ' ')}", f"{group.replace('-', ' ')}s"))
        command.__doc__ = VERBS[name].format(a=one, many=many)
    return command


class SharedTyper(typer.Typer):
    """A Typer whose every command takes what `shared` gives (`group`: what its commands act on)."""

    def __init__(self, *args: Any, group: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group = group

    def command(self, name: str | None = None, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        register = super().command(name, *args, **kwargs)

        def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
            register(shared(fn, self.group or name or fn.__name__, name))
            return fn

        return decorator
