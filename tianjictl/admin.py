"""`tianji` commands for the operator: tenants, credentials, the audit log, hosts."""

from __future__ import annotations

import time

import typer

from tianjictl.main import app, call, done, fail, resource, show
from tianjictl.output import INVALID, NOT_FOUND

tenant = resource("tenant", "Tenants (admin).")
TENANT_COLS = ["id", "name", "token"]


@tenant.command("create")
def tenant_create(ctx: typer.Context, name: str) -> None:
    show(ctx, call(ctx, "POST", "/v1/tenants", {"name": name}), TENANT_COLS, "tenant (keep the token: shown once)")


@tenant.command("list")
def tenant_list(ctx: typer.Context) -> None:
    show(ctx, call(ctx, "GET", "/v1/tenants"), ["id", "name"])


@tenant.command("delete")
def tenant_delete(ctx: typer.Context, tenant_id: str) -> None:
    call(ctx, "DELETE", f"/v1/tenants/{tenant_id}")
    done(ctx, f"deleted tenant {tenant_id}", deleted=tenant_id)


@tenant.command("token-create")
def tenant_token_create(ctx: typer.Context, tenant_id: str, name: str = typer.Option(None)) -> None:
    """A further token for the tenant (rotation: hand it out, then revoke the old one)."""
    show(ctx, call(ctx, "POST", f"/v1/tenants/{tenant_id}/tokens", {"name": name}), ["id", "name", "token"],
         "token (keep it: shown once)")


@tenant.command("token-list")
def tenant_token_list(ctx: typer.Context, tenant_id: str) -> None:
    """The tenant's tokens (names and dates; never the tokens themselves)."""
    show(ctx, call(ctx, "GET", f"/v1/tenants/{tenant_id}/tokens"), ["id", "name", "created_at"], "tokens")


@tenant.command("token-revoke")
def tenant_token_revoke(ctx: typer.Context, tenant_id: str, token_id: str) -> None:
    """Revoke one of the tenant's tokens, at once in every controller process."""
    call(ctx, "DELETE", f"/v1/tenants/{tenant_id}/tokens/{token_id}")
    done(ctx, f"revoked token {token_id}", revoked=token_id)


@tenant.command("quota")
def tenant_quota(ctx: typer.Context, tenant_id: str,
                 set_: list[str] = typer.Option(None, "--set",
                                                help="RESOURCE=LIMIT (-1 unlimited, 'default')")) -> None:
    """Show a tenant's quotas and usage; with --set (admin), change them."""
    if set_:
        body: dict[str, int | None] = {}
        for item in set_:
            k, sep, v = item.partition("=")
            if not sep:
                fail(f"--set {item!r}: write RESOURCE=LIMIT, e.g. --set vpcs=100")
            body[k.replace("-", "_")] = None if v == "default" else int(v) if v.lstrip("-").isdigit() else \
                fail(f"--set {item!r}: LIMIT is a number, -1 (unlimited) or 'default'")
        got = call(ctx, "PUT", f"/v1/tenants/{tenant_id}/quotas", body)
    else:
        got = call(ctx, "GET", f"/v1/tenants/{tenant_id}/quotas")
    rows = [{"resource": r, "used": q["used"], "limit": "unlimited" if q["limit"] < 0 else q["limit"]}
            for r, q in (got or {}).items()]
    show(ctx, got if ctx.obj.output in ("json", "yaml") else rows, ["resource", "used", "limit"], "quotas")


credential = resource("credential", "Host and orchestrator credentials (admin).")
CRED_COLS = ["id", "name", "kind", "role", "host", "created_at"]


@credential.command("host")
def credential_host(ctx: typer.Context, host_name: str, kind: str = typer.Option("hypervisor"),
                    name: str = typer.Option(None, help="the credential's name (default: the host's)"),
                    role: str = typer.Option(None, help="a gateway's role (nat, lb): it registers with this one "
                                                        "only (default: the role its host first registers with)"),
                    ) -> None:
    """A token for one host: it registers, beats, reports and reads that host's config, nothing else."""
    show(ctx, call(ctx, "POST", "/v1/host-tokens", {"host": host_name, "kind": kind, "name": name, "role": role}),
         CRED_COLS + ["token"], "credential (keep the token: shown once)")


@credential.command("orchestrator")
def credential_orchestrator(ctx: typer.Context, name: str = typer.Argument("orchestrator")) -> None:
    """A token for what places VMs: it creates and binds any tenant's ports to hosts, nothing else."""
    show(ctx, call(ctx, "POST", "/v1/orchestrator-tokens", {"name": name}), CRED_COLS + ["token"],
         "credential (keep the token: shown once)")


@credential.command("list")
def credential_list(ctx: typer.Context) -> None:
    show(ctx, call(ctx, "GET", "/v1/host-tokens"), CRED_COLS, "credentials")


@credential.command("revoke")
def credential_revoke(ctx: typer.Context, credential_id: str) -> None:
    """Revoke a host or orchestrator credential."""
    call(ctx, "DELETE", f"/v1/host-tokens/{credential_id}")
    done(ctx, f"revoked credential {credential_id}", revoked=credential_id)


@app.command("audit")
def audit(ctx: typer.Context, tenant_id: str = typer.Option(None, "--tenant"),
          limit: int = typer.Option(100)) -> None:
    """The audit log (admin): who wrote what, when, and the revision it made."""
    show(ctx, call(ctx, "GET", "/v1/audit", tenant_id=tenant_id, limit=limit),
         ["at", "actor_kind", "actor", "method", "path", "revision"], "audit log")


host = resource("host", "Hypervisors and gateway hosts (admin).")
HOST_COLS = ["name", "vtep_ip", "kind", "status", "ports", "last_seen"]


@host.command("list")
def host_list(ctx: typer.Context) -> None:
    show(ctx, call(ctx, "GET", "/v1/hosts"), HOST_COLS, "hosts")


@host.command("register")
def host_register(ctx: typer.Context, name: str, vtep_ip: str = typer.Option(...),
                  kind: str = typer.Option("hypervisor")) -> None:
    show(ctx, call(ctx, "POST", "/v1/hosts", {"name": name, "vtep_ip": vtep_ip, "kind": kind}), HOST_COLS)


@host.command("move-vtep")
def host_move_vtep(ctx: typer.Context, name: str, vtep_ip: str) -> None:
    """Move a host's VTEP (admin): a host's own token cannot, so that a stolen one cannot redirect its traffic."""
    show(ctx, call(ctx, "PATCH", f"/v1/hosts/{name}", {"vtep_ip": vtep_ip}), HOST_COLS)


@host.command("drain")
def host_drain(ctx: typer.Context, name: str) -> None:
    """Move a gateway instance's traffic to the others of its role before stopping it (admin); it stays drained,
    restarts included, until `tianji host undrain`."""
    show(ctx, call(ctx, "POST", f"/v1/hosts/{name}/drain"), HOST_COLS)


@host.command("undrain")
def host_undrain(ctx: typer.Context, name: str) -> None:
    """Let a drained gateway instance take traffic again (admin)."""
    show(ctx, call(ctx, "DELETE", f"/v1/hosts/{name}/drain"), HOST_COLS)


@host.command("delete")
def host_delete(ctx: typer.Context, name: str) -> None:
    """Remove a host (admin): it must have no bound port left."""
    call(ctx, "DELETE", f"/v1/hosts/{name}")
    done(ctx, f"deleted host {name}", deleted=name)


@host.command("show")
def host_show(ctx: typer.Context, name: str) -> None:
    """A host, and what its agent last reported (applied revision, errors)."""
    show(ctx, call(ctx, "GET", f"/v1/hosts/{name}"), HOST_COLS + ["role", "revision_applied", "agent_errors",
                                                                  "last_error"])


@app.command("whoami")
def whoami(ctx: typer.Context) -> None:
    """Who the token is: its kind (admin, tenant, host, orchestrator), tenant and name."""
    show(ctx, call(ctx, "GET", "/v1/whoami"), ["kind", "tenant_id", "name"])


pool = resource("eip-pool", "Public address pools EIPs come from (admin).")


@pool.command("create")
def eip_pool_create(ctx: typer.Context, cidr: str) -> None:
    """Add a pool of public addresses (a CIDR) that EIPs are allocated from."""
    show(ctx, call(ctx, "POST", "/v1/eip-pools", {"cidr": cidr}), ["id", "cidr"])


@pool.command("list")
def eip_pool_list(ctx: typer.Context) -> None:
    """The public address pools."""
    show(ctx, call(ctx, "GET", "/v1/eip-pools"), ["id", "cidr"], "EIP pools")


@pool.command("delete")
def eip_pool_delete(ctx: typer.Context, pool: str = typer.Argument(..., help="the pool's id or its CIDR")) -> None:
    """Remove a pool none of whose addresses is a tenant's EIP (their tenants release them first)."""
    pool_id = next((x["id"] for x in call(ctx, "GET", "/v1/eip-pools") if pool in (x["id"], x["cidr"])), pool)
    call(ctx, "DELETE", f"/v1/eip-pools/{pool_id}")
    done(ctx, f"deleted EIP pool {pool}", deleted=pool_id)


host_token = resource("host-token", "Hosts' credentials (admin): create, rotate, revoke.")


@host_token.command("create")
def host_token_create(ctx: typer.Context, host_name: str,
                      kind: str = typer.Option("hypervisor", help="hypervisor or gateway"),
                      role: str = typer.Option(None, help="a gateway's role (nat, lb, private-line, service)"),
                      name: str = typer.Option(None, help="the credential's name (default: the host's)")) -> None:
    """A token for one host: it registers, beats, reports and reads that host's config, nothing else."""
    show(ctx, call(ctx, "POST", "/v1/host-tokens", {"host": host_name, "kind": kind, "name": name, "role": role}),
         CRED_COLS + ["token"], "credential (keep the token: shown once)")


@host_token.command("list")
def host_token_list(ctx: typer.Context) -> None:
    """Host and orchestrator credentials (never the tokens: only their hashes are kept)."""
    show(ctx, call(ctx, "GET", "/v1/host-tokens"), CRED_COLS, "credentials")


@host_token.command("rotate")
def host_token_rotate(ctx: typer.Context, credential: str) -> None:
    """A new token for the same host, kind and role; the old one is revoked once the new one exists."""
    old = _credential(ctx, credential)
    stamp = time.strftime("%Y%m%d%H%M%S")
    new = call(ctx, "POST", "/v1/host-tokens", {"host": old["host"], "kind": old["kind"], "role": old["role"],
                                                 "name": f"{old['host']}-{stamp}"})
    call(ctx, "DELETE", f"/v1/host-tokens/{old['id']}")
    show(ctx, new | {"revoked": old["id"]}, CRED_COLS + ["token", "revoked"],
         "new credential (keep the token: shown once); the old one is revoked")


@host_token.command("revoke")
def host_token_revoke(ctx: typer.Context, credential: str) -> None:
    """Revoke a credential (by name or id), at once in every controller process."""
    old = _credential(ctx, credential)
    call(ctx, "DELETE", f"/v1/host-tokens/{old['id']}")
    done(ctx, f"revoked credential {old['name']}", revoked=old["id"])


def _credential(ctx: typer.Context, ref: str) -> dict:
    found = [c for c in call(ctx, "GET", "/v1/host-tokens") if ref in (c["id"], c["name"])]
    if not found:
        fail(f"CREDENTIAL: no credential is named {ref!r} (`tianji host-token list`)", NOT_FOUND)
    if not found[0]["host"]:
        fail(f"CREDENTIAL: {ref} is an orchestrator's credential, not a host's", INVALID)
    return found[0]
