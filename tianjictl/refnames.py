"""Names where a table would show ids: a port's security groups, a subnet's VPC, a peering's two VPCs, a NAT
gateway's EIPs (by address) and, for the admin, each row's tenant. Only in tables with their own columns: `--long`,
`-c`, and `-o json|yaml|value` keep the ids, which scripts read.

A referenced object the caller cannot see (the other side of a peering with another tenant) keeps its id: a name
is never learnt through a reference. Lookups that fail leave the ids; a table is never refused for want of names.
"""

from __future__ import annotations

from typing import Any

# an id column -> (the table's header, the collection its objects are in, the field that names them)
NAMED = {"vpc_id": ("vpc", "vpcs", "name"), "requester_vpc_id": ("requester_vpc", "vpcs", "name"),
         "accepter_vpc_id": ("accepter_vpc", "vpcs", "name"), "subnet_id": ("subnet", "subnets", "name"),
         "security_group_ids": ("security_groups", "security-groups", "name"),
         "eip_ids": ("eips", "eips", "address"), "tenant_id": ("tenant", "tenants", "name")}
FEW = 20  # up to this many ids are fetched one by one; more, the whole collection once


class Names:
    """Each collection's names, fetched at most once per command."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.known: dict[str, dict[str, str]] = {}

    def resolve(self, collection: str, field: str, ids: set[str]) -> dict[str, str]:
        from tianji.api_client import ApiFailure

        got = self.known.setdefault(collection, {})
        missing = ids - got.keys()
        try:
            if len(missing) > FEW:
                got.update({o["id"]: o[field] for o in self.client.get(f"/v1/{collection}")})
            else:
                for i in missing:
                    try:
                        got[i] = self.client.get(f"/v1/{collection}/{i}")[field]
                    except ApiFailure as e:
                        if e.status not in (403, 404):  # not the caller's to see: its id stays
                            raise
        except ApiFailure:
            pass
        return got


TENANT_TOKEN_PREFIX = "tjt_"  # the controller's tenant tokens (controller/api/tenants.py): no need to ask


def admin(client: Any) -> bool:
    from tianji.api_client import ApiFailure

    if (client.token or "").startswith(TENANT_TOKEN_PREFIX):
        return False
    try:
        return client.get("/v1/whoami").get("kind") == "admin"
    except ApiFailure:
        return False


def by_name(rows: list[dict], columns: list[str], client: Any) -> tuple[list[dict], list[str], list[str]]:
    """(rows with names for ids, the columns to print, their headers). The tenant column only for the admin: a
    tenant's own rows are all its own."""
    names = Names(client)
    cols = [c for c in columns if c != "tenant_id" or admin(client)]
    out = [dict(r) for r in rows]
    for c in cols:
        if c not in NAMED:
            continue
        _, collection, field = NAMED[c]
        ids = {i for r in rows for i in _ids(r.get(c))}
        if not ids:
            continue
        known = names.resolve(collection, field, ids)
        for r in out:
            v = r.get(c)
            r[c] = [known.get(i, i) for i in v] if isinstance(v, list) else known.get(v, v) if v else v
    return out, cols, [NAMED[c][0] if c in NAMED else c for c in cols]


def _ids(v: Any) -> list[str]:
    if isinstance(v, list):
        return [i for i in v if isinstance(i, str)]
    return [v] if isinstance(v, str) and v else []


__all__ = ["NAMED", "by_name"]
