"""The controller's telemetry: Prometheus metrics at /metrics (names, HELP and TYPE, labels by route and status,
the gauges read when scraped), who may read them, and one structured log line per request with its id."""

from __future__ import annotations

import json
import logging
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.controller import Controller
from tianji.logs import JsonFormatter


def scrape(controller: Controller) -> dict[str, list]:
    r = controller.raw(controller.admin_token).get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    assert re.search(r"^# HELP tianji_controller_requests_total ", r.text, re.M)
    assert re.search(r"^# TYPE tianji_controller_request_duration_seconds histogram$", r.text, re.M)
    return {f.name: f.samples for f in text_string_to_metric_families(r.text)}


def test_requests_are_counted_by_route_and_status_and_timed(controller: Controller) -> None:
    t = controller.tenant()
    vpc = t.post("/v1/vpcs", {"name": "prod", "cidr": "10.0.0.0/16"})
    t.get(f"/v1/vpcs/{vpc['id']}")
    assert t.http.get("/v1/vpcs/nosuch").status_code == 404
    controller.admin.post("/v1/hosts", {"name": "hv1", "vtep_ip": "172.31.0.1"})
    m = scrape(controller)
    counts = {(s.labels["method"], s.labels["route"], s.labels["status"]): s.value
              for s in m["tianji_controller_requests"] if s.name.endswith("_total")}
    assert counts[("POST", "/v1/vpcs", "201")] == 1
    assert counts[("GET", "/v1/vpcs/{vpc_id}", "200")] == 1  # the route's template, not each id
    assert counts[("GET", "/v1/vpcs/{vpc_id}", "404")] == 1
    buckets = [s for s in m["tianji_controller_request_duration_seconds"]
               if s.name.endswith("_count") and s.labels["route"] == "/v1/vpcs"]
    assert buckets and buckets[0].value == 1
    hosts = {(s.labels["kind"], s.labels["status"]): s.value for s in m["tianji_controller_hosts"]}
    assert hosts[("hypervisor", "up")] == 1
    assert m["tianji_controller_revision"][0].value > 0
    assert [s.labels["database"] for s in m["tianji_controller_info"]] == [controller.db.engine.dialect.name]


def test_hosts_watches_are_kept_apart_from_the_apis_latency(controller: Controller) -> None:
    controller.admin.post("/v1/hosts", {"name": "hv1", "vtep_ip": "172.31.0.1"})
    host = controller.raw(controller.host_token("hv1"))
    assert host.get("/v1/hosts/hv1/config", params={"after": -1}).status_code == 200  # a read: the API's
    rev = int(host.get("/v1/hosts/hv1/config").headers.get("x-tianji-revision", "0") or 0)
    after = max(rev, controller.snapshot()["revision"])
    assert host.get("/v1/hosts/hv1/config", params={"after": after, "timeout": 0.3}).status_code == 304  # a wait
    m = scrape(controller)
    api = {s.labels["route"]: s.value for s in m["tianji_controller_request_duration_seconds"]
           if s.name.endswith("_count")}
    watch = {s.labels["route"]: s.value for s in m["tianji_controller_watch_duration_seconds"]
             if s.name.endswith("_count")}
    assert api["/v1/hosts/{name}/config"] == 2 and watch["/v1/hosts/{name}/config"] == 1
    slow = [s for s in m["tianji_controller_watch_duration_seconds"] if s.name.endswith("_sum")]
    assert slow[0].value >= 0.25  # the wait's duration went there (the loop's timer may wake a hair early)


def test_the_standard_process_metrics_are_exported(controller: Controller) -> None:
    m = scrape(controller)
    for name in ("process_resident_memory_bytes", "process_cpu_seconds", "process_open_fds",
                 "process_start_time_seconds"):
        assert name in m and m[name][0].value > 0, name


def test_metrics_need_the_admin_token(controller: Controller) -> None:
    assert controller.raw().get("/metrics").status_code == 401
    assert controller.raw(controller.tenant().token).get("/metrics").status_code == 401


@pytest.mark.parametrize("backend", ["sqlite"])
def test_metrics_can_be_open_to_a_trusted_scraper(backend: str, tmp_path) -> None:
    from tests.conftest import served

    with served(backend, tmp_path, metrics_open=True) as c:
        r = c.raw().get("/metrics")
        assert r.status_code == 200 and "tianji_controller_requests_total" in r.text


def test_every_request_is_logged_once_with_its_id_and_credential(controller: Controller,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    t = controller.tenant("acme-logs")
    with caplog.at_level(logging.INFO, logger="tianji.access"):
        r = t.http.post("/v1/vpcs", json={"name": "prod", "cidr": "10.0.0.0/16"}, headers={"X-Request-Id": "abc123"})
        r2 = t.http.get("/v1/vpcs")
    assert r.headers["x-request-id"] == "abc123"
    assert len(r2.headers["x-request-id"]) == 16  # made up when the client gave none
    recs = [x for x in caplog.records if x.name == "tianji.access"]
    mine = [x for x in recs if x.request_id == "abc123"]
    assert len(mine) == 1
    rec = mine[0]
    assert (rec.method, rec.route, rec.status) == ("POST", "/v1/vpcs", 201)
    assert rec.credential.startswith("acme-logs") and rec.latency_ms > 0
    line = json.loads(JsonFormatter().format(rec))
    assert line["request_id"] == "abc123" and line["status"] == 201 and line["level"] == "info"
    assert line["msg"].startswith("POST /v1/vpcs 201") and line["ts"].endswith("Z")
