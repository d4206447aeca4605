"""The southbound schema's version: a config recorded before it carried one (1.0) still programs the same flows;
a newer minor version (fields this code does not know) is read as it is; a newer major version is refused before
anything is applied, with a message that says what to do, and the watch keeps what it holds."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from tests.unit.test_southbound_client import server
from tianji import southbound_client
from tianji.served import LbServed
from tianji.southbound import (
    SECTION_TYPES,
    GatewayConfig,
    GatewayConfigDelta,
    GatewayVpc,
    HostConfig,
    HostConfigDelta,
    LbSection,
    NatSection,
    SnatInfo,
    StaticEip,
)
from tianji.southbound_client import Southbound
from tianji.wire import SCHEMA_VERSION
from vswitch_agent.flows import compute_flows

RECORDED = Path(__file__).parents[1] / "data" / "host-config-1.0.json"  # hv1's config, recorded at schema 1.0


def flows_of(cfg: HostConfig) -> set:
    ofports = {p.id: 10 + i for i, p in enumerate(cfg.ports)}
    zones = {v.id: 1 + i for i, v in enumerate(cfg.vpcs)}
    return {(f.cookie, f.table, f.priority) for f in compute_flows(cfg, ofports, 100, zones)}


def test_a_config_recorded_at_the_previous_version_programs_what_it_did() -> None:
    raw = json.loads(RECORDED.read_text())
    assert "schema_version" not in raw and len(raw["ports"]) == 2
    old = HostConfig.model_validate(raw)
    now = HostConfig.model_validate_json(old.model_dump_json())
    assert now.schema_version == SCHEMA_VERSION
    assert flows_of(old) and flows_of(old) == flows_of(now)


def test_a_newer_minor_version_is_read_and_its_new_fields_ignored() -> None:
    raw = json.loads(RECORDED.read_text())
    newer = raw | {"schema_version": "1.99", "a_field_from_the_future": {"x": 1}}
    assert flows_of(HostConfig.model_validate(newer)) == flows_of(HostConfig.model_validate(raw))


@pytest.mark.parametrize("model", [HostConfig, HostConfigDelta, GatewayConfigDelta])
def test_a_newer_major_version_is_refused_saying_what_to_do(model) -> None:
    with pytest.raises(ValidationError) as e:
        model.model_validate({"schema_version": "2.0", "host": "hv1", "name": "gw1", "revision": 9, "base": 1})
    assert "schema 2.0" in str(e.value) and "upgrade" in str(e.value)


def watched(monkeypatch, bodies: list[bytes], after: int) -> tuple[list, list, list]:
    """A host's delta watch asking from `after`, answered `bodies` in turn, then stopped: (the deltas it
    applied, the errors it met, the requests it sent)."""
    monkeypatch.setattr(southbound_client, "RETRY_S", 0.01)
    stop, errors, applied = threading.Event(), [], []
    answers = iter(bodies)

    def answer(_path: str) -> tuple:
        try:
            return 200, next(answers), {}
        except StopIteration:
            stop.set()
            return 304, b"", {}

    with server(answer) as (url, seen):
        Southbound(url, "t").watch("/v1/hosts/hv1/config/delta", HostConfigDelta, lambda: {"after": after},
                                   lambda d, _a: applied.append(d), errors.append, stop)
    return applied, errors, seen


def test_the_watch_applies_nothing_of_a_newer_major_version_and_keeps_its_revision(monkeypatch) -> None:
    applied, errors, seen = watched(monkeypatch, [b'{"schema_version": "2.0", "host": "hv1", "revision": 12, '
                                                  b'"base": 7}'] * 2, 7)
    assert applied == [] and len(errors) == 2 and "upgrade" in str(errors[0])
    assert all("after=7" in p for p, _, _ in seen)  # still asking from what it holds


class Section11(BaseModel):
    """A gateway section as a gateway of schema 1.1 parses it: one type with every role's fields."""

    vpc: dict
    static: list = []
    dnat: list = []
    endpoints: list = []
    eips: list[str] = []
    lbs: list = []
    lines: list = []
    services: list = []


def test_a_gateway_of_the_previous_minor_version_reads_each_roles_section() -> None:
    """Schema 1.2 gives each role its own section type; a 1.1 gateway reads them as its one type: `role` ignored,
    the other roles' fields empty."""
    vpc = GatewayVpc(id="v1", vni=5001, router_mac="0a:58:00:00:00:01", snat=[SnatInfo(cidr="10.0.0.0/24",
                                                                                       eips=["203.0.113.1"])])
    nat = NatSection(vpc=vpc, eips=["203.0.113.1"], static=[StaticEip(vni=5001, ip="10.0.0.5", eip="203.0.113.2")])
    lb = LbSection(vpc=vpc, lbs=[LbServed(id="lb1", vni=5001, vip="10.0.0.100", listeners=[])])
    d = GatewayConfigDelta(name="gw1", revision=3, base=-1, vpc_ids=["v1"], sections=[nat, lb])
    old = [Section11.model_validate(x) for x in json.loads(d.model_dump_json())["sections"]]
    assert old[0].eips == ["203.0.113.1"] and old[0].static[0]["eip"] == "203.0.113.2" and old[0].lbs == []
    assert old[1].lbs[0]["id"] == "lb1" and old[1].static == [] and old[1].vpc["snat"][0]["cidr"] == "10.0.0.0/24"
    assert [type(x) for x in GatewayConfigDelta.model_validate_json(d.model_dump_json()).sections] == \
        [NatSection, LbSection]


def test_a_gateway_refuses_sections_without_a_role_saying_to_upgrade_the_controller() -> None:
    raw = {"name": "gw1", "revision": 3, "base": -1, "vpc_ids": ["v1"], "schema_version": "1.1",
           "sections": [Section11(vpc={"id": "v1", "vni": 5001, "router_mac": "0a:58:00:00:00:01"}).model_dump()]}
    with pytest.raises(ValidationError) as e:
        GatewayConfigDelta.model_validate(raw)
    assert "upgrade the controller first" in str(e.value)


def test_a_whole_config_cut_into_sections_of_each_role_gives_that_roles_type() -> None:
    from nfv_gateways.core.sections import sections_of

    vpc = GatewayVpc(id="v1", vni=5001, router_mac="0a:58:00:00:00:01")
    cfg = GatewayConfig(name="gw1", revision=1, vpcs=[vpc],
                        lbs=[LbServed(id="lb1", vni=5001, vip="10.0.0.100", listeners=[])])
    for role, cls in SECTION_TYPES.items():
        (sec,) = sections_of(cfg, role).values()
        assert type(sec) is cls and sec.vpc == vpc
    assert sections_of(cfg, "lb")["v1"].lbs == cfg.lbs


def test_a_config_from_a_controller_older_than_this_release_is_refused_until_the_controller_is_upgraded(
        monkeypatch) -> None:
    """Controllers first (docs/operations.md, Upgrades): an agent newer than its controller applies nothing of
    what that controller sends, says why, and takes the first answer of the upgraded controller."""
    from tianji.wire import OLDEST_CONTROLLER

    major, minor = OLDEST_CONTROLLER.split(".")
    older = f"{major}.{int(minor) - 1}"
    applied, errors, _ = watched(monkeypatch, [
        f'{{"schema_version": "{older}", "host": "hv1", "revision": 12, "base": -1}}'.encode()] * 2 + [
        f'{{"schema_version": "{SCHEMA_VERSION}", "host": "hv1", "revision": 13, "base": -1}}'.encode()], -1)
    assert [d.revision for d in applied] == [13] and len(errors) == 2
    assert f"schema {older}" in str(errors[0]) and "upgrade the controllers first" in str(errors[0])
