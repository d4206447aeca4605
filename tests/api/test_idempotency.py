"""`Idempotency-Key` on creates: a retried create answers the first answer and makes nothing new; a key reused
for another request is refused; keys are each credential's own; concurrent retries never create twice."""

from __future__ import annotations

import threading

from tests.support.controller import Controller


def test_a_retried_create_gets_the_first_answer(controller: Controller) -> None:
    t = controller.tenant()
    raw = controller.raw(t.token)
    body = {"name": "prod", "cidr": "10.0.0.0/16"}
    first = raw.post("/v1/vpcs", json=body, headers={"Idempotency-Key": "k1"})
    again = raw.post("/v1/vpcs", json=body, headers={"Idempotency-Key": "k1"})
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() and again.headers["idempotent-replayed"] == "true"
    assert len(t.get("/v1/vpcs")) == 1
    # the same body without a key (or with another) is a new create: here a conflict on the name
    assert raw.post("/v1/vpcs", json=body, headers={"Idempotency-Key": "k2"}).status_code == 409
    refused = raw.post("/v1/vpcs", json=body, headers={"Idempotency-Key": "k2"})
    assert refused.status_code == 409 and refused.headers["idempotent-replayed"] == "true"
    r = raw.post("/v1/vpcs", json=body | {"name": "other"}, headers={"Idempotency-Key": "k1"})
    assert r.status_code == 422 and r.json()["field"] == "Idempotency-Key"
    # another credential's key of the same name is its own
    other = controller.tenant()
    r = controller.raw(other.token).post("/v1/vpcs", json=body, headers={"Idempotency-Key": "k1"})
    assert r.status_code == 201 and r.json()["id"] != first.json()["id"]


def test_ports_and_long_keys(controller: Controller) -> None:
    t, orch = controller.tenant(), controller.orchestrator()
    vpc = t.post("/v1/vpcs", {"name": "prod", "cidr": "10.0.0.0/16"})
    sn = t.post("/v1/subnets", {"vpc_id": vpc["id"], "name": "web", "cidr": "10.0.1.0/24"})
    raw = controller.raw(t.token)
    a = raw.post("/v1/ports", json={"subnet_id": sn["id"], "name": "a"}, headers={"Idempotency-Key": "p-1"})
    b = raw.post("/v1/ports", json={"subnet_id": sn["id"], "name": "a"}, headers={"Idempotency-Key": "p-1"})
    assert a.json()["id"] == b.json()["id"] and len(orch.get("/v1/ports", subnet_id=sn["id"])) == 1
    r = raw.post("/v1/ports", json={"subnet_id": sn["id"], "name": "z"}, headers={"Idempotency-Key": "x" * 256})
    assert r.status_code == 422 and r.json()["field"] == "Idempotency-Key"


def test_concurrent_retries_create_once(controller: Controller) -> None:
    t = controller.tenant()
    raw = [controller.raw(t.token) for _ in range(6)]
    answers: list[int] = []

    def create(c) -> None:
        answers.append(c.post("/v1/vpcs", json={"name": "race", "cidr": "10.0.0.0/16"},
                              headers={"Idempotency-Key": "same"}).status_code)

    threads = [threading.Thread(target=create, args=(c,)) for c in raw]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert set(answers) <= {201, 409} and 201 in answers, answers
    assert len(t.get("/v1/vpcs")) == 1
