"""`tianji lb`: load balancers, their listeners, pools, members (with a status view) and health monitors."""

from __future__ import annotations

import typer

from tianjictl.main import call, console, done, resource, show

lb = resource("lb", "Load balancers: a VIP in front of VMs (Maglev-hashed L4 on scale-out gateway instances).")
LB_COLS = ["id", "name", "vip_address", "eip_address", "provisioning_status", "operating_status", "vpc_id"]
LISTENER_COLS = ["id", "protocol", "port", "default_pool_id", "idle_timeout_s"]
POOL_COLS = ["id", "name", "protocol", "algorithm", "table_size", "deregistration_delay_s", "operating_status"]
MEMBER_COLS = ["id", "address", "protocol_port", "weight", "operating_status", "status_changed_at", "port_id"]
MONITOR_COLS = ["pool_id", "type", "interval_s", "timeout_s", "rise", "fall", "http_method", "url_path",
                "expected_codes"]


@lb.command("create")
def lb_create(ctx: typer.Context, name: str, vpc_id: str = typer.Option(..., "--vpc"),
              subnet_id: str = typer.Option(..., "--subnet"),
              vip: str = typer.Option(None, "--vip", help="an address in the subnet (default: the next free one)"),
              eip_id: str = typer.Option(None, "--eip", help="an EIP of yours: the VIP from the internet")) -> None:
    body = {"name": name, "vpc_id": vpc_id, "subnet_id": subnet_id} | ({"vip_address": vip} if vip else {}) | \
        ({"eip_id": eip_id} if eip_id else {})
    show(ctx, call(ctx, "POST", "/v1/load-balancers", body), LB_COLS)


@lb.command("list")
def lb_list(ctx: typer.Context) -> None:
    show(ctx, call(ctx, "GET", "/v1/load-balancers"), LB_COLS, "load balancers")


@lb.command("show")
def lb_show(ctx: typer.Context, lb_id: str) -> None:
    show(ctx, call(ctx, "GET", f"/v1/load-balancers/{lb_id}"), LB_COLS + ["listener_ids", "pool_ids"])


@lb.command("delete")
def lb_delete(ctx: typer.Context, lb_id: str) -> None:
    call(ctx, "DELETE", f"/v1/load-balancers/{lb_id}")
    done(ctx, f"deleted load balancer {lb_id} (with its listeners, pools and members)", deleted=lb_id)


@lb.command("listener-create")
def listener_create(ctx: typer.Context, lb_id: str, protocol: str = typer.Option(..., help="tcp or udp"),
                    port: int = typer.Option(...), pool_id: str = typer.Option(None, "--pool"),
                    idle_timeout_s: int = typer.Option(350, "--idle-timeout")) -> None:
    """Add a listener (protocol and port) to a load balancer."""
    body = {"protocol": protocol, "port": port, "idle_timeout_s": idle_timeout_s} | \
        ({"default_pool_id": pool_id} if pool_id else {})
    show(ctx, call(ctx, "POST", f"/v1/load-balancers/{lb_id}/listeners", body), LISTENER_COLS)


@lb.command("listener-list")
def listener_list(ctx: typer.Context, lb_id: str) -> None:
    """The listeners of a load balancer."""
    show(ctx, call(ctx, "GET", f"/v1/load-balancers/{lb_id}/listeners"), LISTENER_COLS, "listeners")


@lb.command("listener-delete")
def listener_delete(ctx: typer.Context, listener_id: str) -> None:
    """Remove a listener from its load balancer."""
    call(ctx, "DELETE", f"/v1/listeners/{listener_id}")
    done(ctx, f"deleted listener {listener_id}", deleted=listener_id)


@lb.command("pool-create")
def pool_create(ctx: typer.Context, lb_id: str, name: str = typer.Option(...),
                protocol: str = typer.Option(..., help="tcp or udp"),
                algorithm: str = typer.Option("maglev", help="maglev or source_ip"),
                table_size: int = typer.Option(65537, help="Maglev's table size: a prime"),
                deregistration_delay_s: int = typer.Option(30, "--deregistration-delay")) -> None:
    """Add a pool of members behind a listener."""
    body = {"load_balancer_id": lb_id, "name": name, "protocol": protocol, "algorithm": algorithm,
            "table_size": table_size, "deregistration_delay_s": deregistration_delay_s}
    show(ctx, call(ctx, "POST", "/v1/pools", body), POOL_COLS)


@lb.command("pool-list")
def pool_list(ctx: typer.Context) -> None:
    """The pools of a load balancer."""
    show(ctx, call(ctx, "GET", "/v1/pools"), POOL_COLS, "pools")


@lb.command("pool-delete")
def pool_delete(ctx: typer.Context, pool_id: str) -> None:
    """Remove a pool (and its members)."""
    call(ctx, "DELETE", f"/v1/pools/{pool_id}")
    done(ctx, f"deleted pool {pool_id}", deleted=pool_id)


@lb.command("member-add")
def member_add(ctx: typer.Context, pool_id: str, port_id: str = typer.Option(..., "--port"),
               protocol_port: int = typer.Option(..., "--protocol-port"), weight: int = typer.Option(1)) -> None:
    """Add a port to a pool as a member."""
    body = {"port_id": port_id, "protocol_port": protocol_port, "weight": weight}
    show(ctx, call(ctx, "POST", f"/v1/pools/{pool_id}/members", body), MEMBER_COLS)


@lb.command("members")
def members(ctx: typer.Context, pool_id: str) -> None:
    """Each member's health (ONLINE, OFFLINE, DRAINING, NO_MONITOR), since when, and its weight."""
    pool = call(ctx, "GET", f"/v1/pools/{pool_id}")
    show(ctx, call(ctx, "GET", f"/v1/pools/{pool_id}/members"), MEMBER_COLS,
         f"pool {pool['name']}: {pool['operating_status']}")


@lb.command("member-weight")
def member_weight(ctx: typer.Context, pool_id: str, member_id: str, weight: int = typer.Argument(...)) -> None:
    """0 drains: no new connections, established ones end after the pool's deregistration delay."""
    show(ctx, call(ctx, "PATCH", f"/v1/pools/{pool_id}/members/{member_id}", {"weight": weight}), MEMBER_COLS)


@lb.command("member-remove")
def member_remove(ctx: typer.Context, pool_id: str, member_id: str) -> None:
    """Remove a member from its pool."""
    call(ctx, "DELETE", f"/v1/pools/{pool_id}/members/{member_id}")
    done(ctx, f"removed member {member_id}", removed=member_id)


@lb.command("monitor-set")
def monitor_set(ctx: typer.Context, pool_id: str, type_: str = typer.Option(..., "--type", help="tcp, http, "
                                                                                                 "udp-connect"),
                interval_s: float = typer.Option(5.0, "--interval"), timeout_s: float = typer.Option(2.0, "--timeout"),
                rise: int = typer.Option(2), fall: int = typer.Option(3),
                http_method: str = typer.Option(None, "--http-method"), url_path: str = typer.Option(None, "--path"),
                expected_codes: str = typer.Option(None, "--expect")) -> None:
    """Set a pool's health monitor (tcp, http or udp-connect checks)."""
    body = {"type": type_, "interval_s": interval_s, "timeout_s": timeout_s, "rise": rise, "fall": fall} | \
        {k: v for k, v in (("http_method", http_method), ("url_path", url_path),
                           ("expected_codes", expected_codes)) if v is not None}
    show(ctx, call(ctx, "PUT", f"/v1/pools/{pool_id}/health-monitor", body), MONITOR_COLS)


@lb.command("monitor-delete")
def monitor_delete(ctx: typer.Context, pool_id: str) -> None:
    """Remove a pool's health monitor."""
    call(ctx, "DELETE", f"/v1/pools/{pool_id}/health-monitor")
    console.print(f"pool {pool_id}: no health monitor (members NO_MONITOR, treated as healthy)")
