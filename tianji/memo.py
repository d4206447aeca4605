"""A value derived from a pydantic model and kept with it (a private attribute), outside what the model is."""

from __future__ import annotations

from typing import Any


class Memo:
    """Every two compare equal: pydantic compares private attributes, and a cache filled on one of two equal
    models must not make them differ."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: Any = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Memo)

    __hash__ = None  # type: ignore[assignment]
