"""Building trusted models without validation, fast.

pydantic's `model_construct` asks, for every field it fills from a default factory, whether the factory takes the
validated data, by `inspect.signature` of the factory, on every call and uncached (pydantic 2.14: half a
millisecond for a HostConfigDelta with its eleven list fields; a thousand hosts told of a joining one spent more
than half the controller there). `construct` calls the factories itself, so pydantic never asks."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)


@cache
def _factories(cls: type[BaseModel]) -> tuple[tuple[str, Callable[[], Any]], ...]:
    return tuple((n, f.default_factory) for n, f in cls.model_fields.items()
                 if f.default_factory is not None)  # type: ignore[misc]


def construct(cls: type[M], **values: Any) -> M:
    """`cls.model_construct(**values)`, the missing fields with default factories filled here."""
    given = set(values)
    for name, factory in _factories(cls):
        if name not in given:
            values[name] = factory()
    return cls.model_construct(given, **values)
