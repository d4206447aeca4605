"""The console as an operator keeps it open, on a 1366x768 screen: every VPC on the page (rows wrap), tenants by
name, empty states that say what to do next, a tenant's own ports on its Status page, errors in words, the
analyzer's "To" by port name, a click on a port clearing the last answer, the API reference inside the console
(a tenant's operations first) and ReDoc without a request or a console error. Screenshots in artifacts/ui/."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import served
from tests.support.controller import Controller
from tests.ui.test_console import ARTIFACTS, browser, local_only, sign_in, world  # noqa: F401 -- fixtures

SMALL = {"width": 1366, "height": 768}


def open_page(browser, url: str) -> object:  # noqa: F811
    ctx = browser.new_context(viewport=SMALL)
    p = ctx.new_page()
    p.requests, p.errors = [], []

    def network(route) -> None:
        p.requests.append(route.request.url)
        route.continue_() if route.request.url.startswith(url) else route.abort()

    p.route("**/*", network)
    p.on("pageerror", lambda e: p.errors.append(str(e)))
    p.on("console", lambda m: p.errors.append(m.text) if m.type == "error" else None)
    return p


@pytest.fixture
def small(browser, world: dict) -> Iterator[object]:  # noqa: F811
    p = open_page(browser, world["c"].url)
    yield p
    p.context.close()


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    """Eight VPCs of one tenant (more than fit side by side at 1366 px), one without subnets, and a new tenant."""
    with served("sqlite", tmp_path_factory.mktemp("wide"), host_down_after=3600) as c:
        t = c.tenant("initech")
        for i in range(8):
            v = t.post("/v1/vpcs", {"name": f"vpc-{i}", "cidr": f"10.{i}.0.0/16"})
            if i:
                t.post("/v1/subnets", {"vpc_id": v["id"], "name": f"net-{i}", "cidr": f"10.{i}.1.0/24"})
        c.fresh = c.tenant("newcomer")  # type: ignore[attr-defined]
        c.initech = t  # type: ignore[attr-defined]
        yield c


def test_every_vpc_is_on_the_page_at_1366x768_and_an_empty_vpc_says_what_next(browser, wide) -> None:  # noqa: F811
    page = open_page(browser, wide.url)
    try:
        sign_in(page, {"c": wide}, wide.initech.token)
        boxes = page.eval_on_selector_all("g.vpc:not(.ghost-vpc) rect.vpc-box",
                                          "rs => rs.map(r => { const b = r.getBoundingClientRect(); "
                                          "return [b.left, b.right]; })")
        assert len(boxes) == 8
        assert all(0 <= left and right <= SMALL["width"] for left, right in boxes), boxes  # rows wrap
        empty = page.locator("g.vpc[data-name='vpc-0']").text_content()
        assert "no subnets: create one with" in empty and "tianji subnet create" in empty
        page.screenshot(path=str(ARTIFACTS / "topology-1366.png"), full_page=True)
        assert page.errors == []
    finally:
        page.context.close()


def test_a_new_tenant_is_told_how_to_begin(browser, wide) -> None:  # noqa: F811
    page = open_page(browser, wide.url)
    try:
        page.goto(f"{wide.url}/ui/")
        page.fill("#token", wide.fresh.token)
        page.click("#login-form button[type=submit]")
        page.wait_for_selector("#topology-empty")
        assert "tianji vpc create" in page.text_content("#topology-empty")
        page.click("button[data-view=status]")
        page.wait_for_selector("#ports-empty:not([hidden])")
        assert "tianji port create" in page.text_content("#ports-empty")
        page.screenshot(path=str(ARTIFACTS / "empty-1366.png"), full_page=True)
        assert page.errors == []
    finally:
        page.context.close()


def test_the_admin_sees_tenants_by_name(small, world: dict) -> None:  # noqa: F811
    sign_in(small, world, world["c"].admin_token)
    prod = small.locator("g.vpc[data-name=prod]").text_content()
    assert "tenant acme" in prod and world["tenant"].tenant_id[:8] not in prod, prod


def test_a_tenants_status_page_shows_its_own_ports(small, world: dict) -> None:  # noqa: F811
    sign_in(small, world, world["tenant"].token)
    small.click("button[data-view=status]")
    small.wait_for_selector("#ports-table tr[data-port=web-1]")
    assert small.is_hidden("#operator-hosts")
    row = small.locator("#ports-table tr[data-port=web-1] td").all_text_contents()
    assert row[:6] == ["web-1", world["ports"]["web-1"]["ip"], "prod", "web", "hv1", "DOWN"], row
    assert small.locator("#ports-table tr[data-port=spare] td").nth(4).text_content() == "(unbound)"
    small.screenshot(path=str(ARTIFACTS / "status-tenant-1366.png"), full_page=True)
    assert small.errors == []


def test_the_analyzer_takes_a_port_name_says_errors_in_words_and_a_click_clears_it(small, world: dict) -> None:  # noqa: F811
    sign_in(small, world, world["tenant"].token)
    small.click(f"g.port[data-port-id='{world['ports']['web-1']['id']}']")
    small.wait_for_selector("#reachability:not([hidden])")
    small.fill("#reach-dest", "db-1")  # a port's name
    small.fill("#reach-port", "5432")
    small.click("#reach-form button[type=submit]")
    small.wait_for_selector("#verdict")
    assert small.text_content("#verdict") == "REACHABLE"
    small.fill("#reach-dest", "nosuch")
    small.click("#reach-form button[type=submit]")
    small.wait_for_selector("#reach-result .error")
    assert small.text_content("#reach-result .error") == "no port named nosuch, and not an IP address"
    small.fill("#reach-dest", "10.0.1.999")  # the controller's refusal, in words
    small.click("#reach-form button[type=submit]")
    small.wait_for_function("document.querySelector('#reach-result .error')?.textContent.startsWith('To: ')")
    said = small.text_content("#reach-result .error")
    assert "999" in said and "Value error" not in said and "destination" not in said, said
    small.click("button[data-view=topology]")
    small.click(f"g.port[data-port-id='{world['ports']['web-2']['id']}']")
    small.wait_for_selector("#reachability:not([hidden])")
    assert small.text_content("#reach-result") == ""  # the last answer was web-1's
    assert small.errors == [] or all("422" in e for e in small.errors), small.errors


def test_the_api_reference_opens_inside_the_console_a_tenants_operations_first(small, world: dict) -> None:  # noqa: F811
    sign_in(small, world, world["tenant"].token)
    small.click("button[data-view=api]")
    frame = small.frame_locator("#api-frame")
    frame.locator(".opblock").first.wait_for(timeout=15000)
    assert small.url.endswith("/ui/")  # still the console
    first_tag = frame.locator(".opblock-tag").first.get_attribute("data-tag")
    assert first_tag == "vpcs", first_tag
    small.screenshot(path=str(ARTIFACTS / "api-1366.png"))
    local_only(small, world)


def test_redoc_loads_nothing_from_outside_and_logs_no_error(small, world: dict) -> None:  # noqa: F811
    small.goto(f"{world['c'].url}/redoc")
    small.wait_for_selector("text=Tianji controller", timeout=15000)
    small.wait_for_timeout(500)
    assert small.errors == [], small.errors  # no refused logo, no CSP report
    local_only(small, world)
    assert not any("cdn.redoc.ly" in u for u in small.requests)
