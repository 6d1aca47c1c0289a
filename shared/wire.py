"""Base models for what travels between processes."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer

__all__ = ["OmitNoneModel"]


class OmitNoneModel(BaseModel):
    """A model whose optional fields named in ``omit_when_none`` are left out when None.

    Symbiont skips its optional config sections on output (``skip_serializing_if = is_none``);
    this keeps our JSON the same shape.
    """

    omit_when_none: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _omit_none(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for name in self.omit_when_none:
                if name in data and data[name] is None:
                    del data[name]
        return data
