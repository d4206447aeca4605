"""`construct`: what pydantic's model_construct builds, each default factory called afresh."""

from __future__ import annotations

from tianji.construct import construct
from tianji.southbound import HostConfigDelta


def test_construct_builds_what_model_construct_builds() -> None:
    given = {"host": "hv1", "revision": 7, "base": 3, "vtep_ip": None, "vpc_ids": None}
    ours, theirs = construct(HostConfigDelta, **given), HostConfigDelta.model_construct(**given)
    assert ours.model_dump() == theirs.model_dump()
    assert ours.model_fields_set == theirs.model_fields_set == set(given)


def test_each_construct_has_its_own_lists() -> None:
    a, b = construct(HostConfigDelta, host="a", revision=1, base=0), construct(HostConfigDelta, host="b", revision=1,
                                                                                base=0)
    a.ports_removed.append("p1")
    assert b.ports_removed == []
