"""Wire.model_construct: what pydantic's builds, each default factory called afresh."""

from __future__ import annotations

from pydantic import BaseModel

from tianji.southbound import HostConfigDelta


def test_construct_builds_what_pydantics_builds() -> None:
    given = {"host": "hv1", "revision": 7, "base": 3, "vtep_ip": None, "vpc_ids": None}
    ours = HostConfigDelta.model_construct(**given)
    pydantics = BaseModel.model_construct.__func__(HostConfigDelta, **given)
    assert ours.model_dump() == pydantics.model_dump()
    assert ours.model_fields_set == pydantics.model_fields_set == set(given)


def test_each_construct_has_its_own_lists() -> None:
    a = HostConfigDelta.model_construct(host="a", revision=1, base=0)
    b = HostConfigDelta.model_construct(host="b", revision=1, base=0)
    a.ports_removed.append("p1")
    assert b.ports_removed == []
