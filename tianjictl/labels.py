"""`tianji vpc|subnet|sg update`: a new name, description or tags (the API's PATCH)."""

from __future__ import annotations

import typer

from tianjictl.groups import SG_COLS, sg
from tianjictl.main import call, fail, show
from tianjictl.network import SUBNET_COLS, TAG_HELP, VPC_COLS, labels, subnet, vpc
from tianjictl.output import INVALID


def _patch(ctx: typer.Context, path: str, name: str | None, description: str | None, tags: list[str] | None,
           no_tags: bool, columns: list[str]) -> None:
    body = labels(description, tags, no_tags) | ({"name": name} if name else {})
    if not body:
        fail("give --name, --description, --tag or --no-tags: nothing to change", INVALID)
    show(ctx, call(ctx, "PATCH", path, body), [*columns, *(["description"] if "description" not in columns else [])])


@vpc.command("update")
def vpc_update(ctx: typer.Context, vpc_id: str, name: str = typer.Option(None, help="a new name"),
               description: str = typer.Option(None), tag: list[str] = typer.Option(None, "--tag", help=TAG_HELP),
               no_tags: bool = typer.Option(False, "--no-tags", help="remove every tag")) -> None:
    """Rename a VPC, describe it or tag it."""
    _patch(ctx, f"/v1/vpcs/{vpc_id}", name, description, tag, no_tags, VPC_COLS)


@subnet.command("update")
def subnet_update(ctx: typer.Context, subnet_id: str, name: str = typer.Option(None, help="a new name"),
                  description: str = typer.Option(None),
                  tag: list[str] = typer.Option(None, "--tag", help=TAG_HELP),
                  no_tags: bool = typer.Option(False, "--no-tags", help="remove every tag")) -> None:
    """Rename a subnet, describe it or tag it."""
    _patch(ctx, f"/v1/subnets/{subnet_id}", name, description, tag, no_tags, SUBNET_COLS)


@sg.command("update")
def sg_update(ctx: typer.Context, sg_id: str, name: str = typer.Option(None, help="a new name"),
              description: str = typer.Option(None), tag: list[str] = typer.Option(None, "--tag", help=TAG_HELP),
              no_tags: bool = typer.Option(False, "--no-tags", help="remove every tag")) -> None:
    """Rename a security group, describe it or tag it."""
    _patch(ctx, f"/v1/security-groups/{sg_id}", name, description, tag, no_tags, SG_COLS)
