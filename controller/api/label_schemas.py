"""Descriptions and tags, on VPCs, subnets, ports and security groups: in creates, in answers, in PATCHes."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, Field, StringConstraints


def _each_once(v: list[str]) -> list[str]:
    return list(dict.fromkeys(v))  # a tag given twice is one tag


Tag = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[^\x00,]+$")]  # lists filter by one
Tags = Annotated[list[Tag], Field(max_length=32), AfterValidator(_each_once)]


class LabelsIn(BaseModel):
    description: str = Field("", max_length=255)
    tags: Tags = Field(default_factory=list, description="up to 32, each up to 64 characters, no commas",
                       examples=[["team:ml", "env:prod"]])


class LabelsOut(BaseModel):
    description: str = ""
    tags: list[str] = Field(default_factory=list)


class LabelsPatch(BaseModel):
    """What a PATCH may change besides the name: given fields only (`tags` replaces the list)."""

    description: str | None = Field(None, max_length=255)
    tags: Tags | None = None
