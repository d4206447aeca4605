"""The web console in a real browser: Debian's chromium driven by Playwright, headless, against a served controller
with data. The pages show the controller's real state (topology, status), the analyzer form answers, a tenant sees
only its own networks, nothing is fetched from outside (Swagger UI included), and no script error happens.
Screenshots go to artifacts/ui/ (TIANJI_ARTIFACTS) for a person to look at."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import served
from tests.support.controller import Controller

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("TIANJI_ARTIFACTS", ROOT / "artifacts")) / "ui"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    with served("sqlite", tmp_path_factory.mktemp("ui"), host_down_after=3600) as c:
        yield populate(c)


def populate(c: Controller) -> dict:
    adm, orch = c.admin, c.orchestrator()
    for i, h in enumerate(("hv1", "hv2")):
        adm.post("/v1/hosts", {"name": h, "vtep_ip": f"172.31.0.{i + 1}"})
    adm.post("/v1/hosts", {"name": "gw1", "vtep_ip": "172.31.1.1", "kind": "gateway", "role": "nat"})
    adm.post("/v1/eip-pools", {"cidr": "198.51.100.0/24"})
    t, other = c.tenant("acme"), c.tenant("globex")
    vpc = t.post("/v1/vpcs", {"name": "prod", "cidr": "10.0.0.0/16"})
    web = t.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "web", "cidr": "10.0.1.0/24"})
    db = t.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "db", "cidr": "10.0.2.0/24"})
    dbg = t.post("/v1/security-groups", {"vpc_id": vpc["id"], "name": "db", "rules": [
        {"direction": "ingress", "protocol": "tcp", "port_range_min": 5432, "port_range_max": 5432,
         "remote_cidr": "10.0.1.0/24"}]})
    ports = {n: orch.post("/v1/ports", {"subnet_id": sn["id"], "name": n, "host": h})
             for n, sn, h in (("web-1", web, "hv1"), ("web-2", web, "hv2"), ("db-1", db, "hv2"))}
    t.patch(f"/v1/ports/{ports['db-1']['id']}", {"security_group_ids": [dbg["id"]]})
    t.post("/v1/ports", {"subnet_id": web["id"], "name": "spare"})  # unbound
    eip = t.post("/v1/eips", {})
    t.post("/v1/nat-gateways", {"vpc_id": vpc["id"], "name": "egress", "eip_ids": [eip["id"]]})
    lab = t.post("/v1/vpcs", {"name": "lab", "cidr": "10.7.0.0/16"})
    t.post("/v1/subnets", {"vpc_id": lab["id"], "name": "lab", "cidr": "10.7.0.0/24"})
    theirs = other.post("/v1/vpcs", {"name": "partner", "cidr": "10.9.0.0/16"})
    pc = t.post("/v1/peerings", {"requester_vpc_id": vpc["id"], "accepter_vpc_id": theirs["id"]})
    t.post("/v1/peerings", {"requester_vpc_id": vpc["id"], "accepter_vpc_id": lab["id"]})
    hv1 = c.raw(c.host_token("hv1"))
    assert hv1.post("/v1/hosts/hv1/status", json={"ports": {}, "revision_applied": 41, "errors": 2,
                                                  "last_error": "switch did not answer"}).status_code == 200
    return {"c": c, "tenant": t, "other": other, "ports": ports, "peering": pc, "theirs": theirs}


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "chromium is missing: `make setup` installs Debian's chromium"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser, world: dict) -> Iterator[object]:
    """A fresh page that records every request that goes to the network (what the page's policy blocks never
    does), stops those that would leave this machine, and records every script error."""
    ctx = browser.new_context(viewport={"width": 1500, "height": 950})
    p = ctx.new_page()
    p.requests, p.errors = [], []

    def network(route) -> None:
        p.requests.append(route.request.url)
        if route.request.url.startswith(world["c"].url):
            route.continue_()
        else:
            route.abort()

    p.route("**/*", network)
    p.on("pageerror", lambda e: p.errors.append(str(e)))
    p.on("console", lambda m: p.errors.append(m.text) if m.type == "error" else None)
    p.on("crash", lambda _p: p.errors.append("the page crashed"))
    yield p
    ctx.close()


def sign_in(page, world: dict, token: str) -> None:
    page.goto(f"{world['c'].url}/ui/")
    page.fill("#token", token)
    page.click("#login-form button[type=submit]")
    page.wait_for_selector("#topology-svg")


def local_only(page, world: dict) -> None:
    mine = (world["c"].url, f"blob:{world['c'].url}", "data:")
    outside = [u for u in page.requests if not u.startswith(mine)]
    assert outside == [], f"requests outside the controller: {outside}"


def test_the_admin_sees_the_whole_topology(page, world: dict) -> None:
    sign_in(page, world, world["c"].admin_token)
    names = page.eval_on_selector_all("g.vpc:not(.ghost-vpc)", "gs => gs.map(g => g.dataset.name).sort()")
    assert names == ["lab", "partner", "prod"]
    prod = page.locator("g.vpc[data-name=prod]")
    assert sorted(prod.locator("g.subnet").evaluate_all("gs => gs.map(g => g.dataset.name)")) == ["db", "web"]
    assert prod.locator("g.port").count() == 4
    assert "web-1  10.0.1.2  @hv1" in prod.text_content() and "(unbound)" in prod.text_content()
    assert "NAT egress" in prod.text_content()
    statuses = sorted(page.eval_on_selector_all("path.peering", "ps => ps.map(p => p.dataset.status)"))
    assert statuses == ["active", "pending-acceptance"]
    assert "3 VPCs, 3 subnets, 4 ports (3 bound), 2 peerings" in page.text_content("#topology-summary")
    page.screenshot(path=str(ARTIFACTS / "topology.png"), full_page=True)
    assert page.errors == []
    local_only(page, world)


def test_status_shows_hosts_and_what_their_agents_report(page, world: dict) -> None:
    sign_in(page, world, world["c"].admin_token)
    page.click("button[data-view=status]")
    page.wait_for_selector("#hosts-table tr[data-host=gw1]")
    row = page.locator("#hosts-table tr[data-host=hv1]").locator("td").all_text_contents()
    assert row[:4] == ["hv1", "hypervisor", "", "up"] and row[5] == "1"  # its one bound port
    assert row[6] == "41" and row[8] == "2"  # its agent's applied revision and errors
    assert page.locator("#hosts-table tr[data-host=gw1] td").nth(2).text_content() == "nat"
    assert "revision" in page.text_content("#status-summary")
    page.screenshot(path=str(ARTIFACTS / "status.png"), full_page=True)
    assert page.errors == []


def test_the_analyzer_form_answers_from_a_port_picked_on_the_map(page, world: dict) -> None:
    sign_in(page, world, world["tenant"].token)
    page.click(f"g.port[data-port-id='{world['ports']['web-1']['id']}']")
    page.wait_for_selector("#reachability:not([hidden])")
    assert page.input_value("#reach-source") == world["ports"]["web-1"]["id"]
    page.fill("#reach-dest", world["ports"]["db-1"]["ip"])
    page.fill("#reach-port", "5432")
    page.click("#reach-form button[type=submit]")
    page.wait_for_selector("#verdict")
    assert page.text_content("#verdict") == "REACHABLE"
    hops = page.eval_on_selector_all(".hop", "hs => hs.map(h => h.dataset.host)")
    assert hops == ["hv1", "hv2", "hv2", "hv1"]  # the request, then the reply
    page.screenshot(path=str(ARTIFACTS / "reachability.png"), full_page=True)
    page.fill("#reach-port", "443")
    page.click("#reach-form button[type=submit]")
    page.wait_for_function("document.querySelector('#verdict')?.textContent === 'UNREACHABLE'")
    assert "no ingress rule" in page.text_content("#reason")
    assert page.locator(".hop li.dropped").count() == 1
    assert page.errors == []
    local_only(page, world)


def test_a_tenant_sees_only_its_own_networks(page, world: dict) -> None:
    sign_in(page, world, world["tenant"].token)
    names = page.eval_on_selector_all("g.vpc:not(.ghost-vpc)", "gs => gs.map(g => g.dataset.name).sort()")
    assert names == ["lab", "prod"]
    assert page.locator("g.ghost-vpc").count() == 1  # the peer's VPC: there, but not its contents
    assert "partner" not in page.text_content("#topology-canvas")
    page.click("button[data-view=status]")
    page.wait_for_selector("#status-summary:has-text('the admin')")
    assert page.locator("#hosts-table tbody tr").count() == 0
    page.click("#logout")
    assert page.is_visible("#login")
    assert page.errors == []


def test_swagger_ui_and_redoc_load_with_no_outside_request(page, world: dict) -> None:
    page.goto(f"{world['c'].url}/docs")
    page.wait_for_selector(".opblock", timeout=15000)
    assert page.locator(".opblock").count() > 50
    assert page.locator("button.authorize").count() == 1  # the bearer scheme
    page.screenshot(path=str(ARTIFACTS / "swagger.png"))
    page.goto(f"{world['c'].url}/redoc")
    page.wait_for_selector("text=Tianji controller", timeout=15000)
    local_only(page, world)


def test_the_analyzer_names_nothing_of_a_peer_tenant(browser, tmp_path: Path) -> None:
    """Asked from a tenant's port to its peer tenant's port, the console's answer (verdict, reason, hops) names
    nothing of the peer: its VPC, subnet, groups, port, host, VNI."""
    with served("sqlite", tmp_path, host_down_after=3600) as c:
        adm, orch = c.admin, c.orchestrator()
        for i, h in enumerate(("hv1", "hv2")):
            adm.post("/v1/hosts", {"name": h, "vtep_ip": f"172.31.0.{i + 1}"})
        me, peer = c.tenant("initech"), c.tenant("umbrella")
        ops = me.post("/v1/vpcs", {"name": "ops", "cidr": "10.60.0.0/16"})
        mine = orch.post("/v1/ports", {"subnet_id": me.post("/v1/subnets", {"vpc_id": ops["id"], "name": "ops-net",
                                                                            "cidr": "10.60.1.0/24"})["id"],
                                       "name": "ops-1", "host": "hv1"})
        lab = peer.post("/v1/vpcs", {"name": "secret-lab", "cidr": "10.61.0.0/16"})
        lsub = peer.post("/v1/subnets", {"vpc_id": lab["id"], "name": "vault-net", "cidr": "10.61.1.0/24"})
        vg = peer.post("/v1/security-groups", {"vpc_id": lab["id"], "name": "vault-only", "rules": []})
        vault = orch.post("/v1/ports", {"subnet_id": lsub["id"], "name": "vault-7", "host": "hv2"})
        peer.patch(f"/v1/ports/{vault['id']}", {"security_group_ids": [vg["id"]]})
        pc = me.post("/v1/peerings", {"requester_vpc_id": ops["id"], "accepter_vpc_id": lab["id"]})
        peer.post(f"/v1/peerings/{pc['id']}/accept")
        ctx = browser.new_context(viewport={"width": 1500, "height": 950})
        page = ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            page.goto(f"{c.url}/ui/")
            page.fill("#token", me.token)
            page.click("#login-form button[type=submit]")
            page.wait_for_selector("#topology-svg")
            page.click(f"g.port[data-port-id='{mine['id']}']")
            page.wait_for_selector("#reachability:not([hidden])")
            page.fill("#reach-dest", vault["ip"])
            page.fill("#reach-port", "22")
            page.click("#reach-form button[type=submit]")
            page.wait_for_selector("#verdict")
            assert page.text_content("#verdict") == "UNREACHABLE"
            assert page.text_content("#reason") == "decided by the peer tenant's configuration: dropped"
            shown = page.text_content("#reach-result")
            page.screenshot(path=str(ARTIFACTS / "reachability-peer.png"), full_page=True)
            for secret in ("secret-lab", "vault", "umbrella", "hv2", lab["id"], lsub["id"], vg["id"], vault["id"],
                           lab["default_security_group_id"], f"VNI {lab['vni']}", peer.tenant_id):
                assert secret not in shown, (secret, shown)
            assert "hv1" in shown and "ops-1" in shown  # the asker's own side, in full
            assert errors == []
        finally:
            ctx.close()
