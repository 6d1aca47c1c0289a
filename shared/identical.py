"""Identical frozen settings held once per process, not once per request or task.

Every reasoning request carries its task's loop config, provider and policy, and every task
spec its stagnation thresholds, limits and policy: in a deployment running one kind of task
they are the same in every request, and each parse built a copy of each (about 5 KB a reasoning
request, 8 KB a task; docs/performance.md, branch ``mem3``). A field annotated
``Annotated[Model, SharedWhenIdentical()]`` is validated once per distinct JSON value: a
later request whose value is the same JSON text (its keys in the same order) gets the instance
parsed first. The models so annotated are frozen and nothing changes their lists in place, so
one instance may stand for every equal one, as one ``str`` does for equal interned strings.

What is shared is exactly what validation would have built again: the same input under the same
validation (JSON mode, no context), so the same values and the same ``model_fields_set`` (an
``exclude_unset`` dump is the same). Python-mode validation (a dict or a model given in code,
``model_validate(..., extra=...)`` whose overrides the key cannot see) is never shared, nor is a
value that fails (it raises as before). Each kind keeps its :data:`SHARED_KEPT` most recently
used values.

:func:`shared_default` gives a default factory that returns one instance built once, for the
same models' defaults (a task that sets no stagnation thresholds shares the default ones).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from pydantic import (
    BaseModel,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)

__all__ = ["SHARED_KEPT", "SharedWhenIdentical", "shared_default"]

SHARED_KEPT = 64
"""Distinct values kept per kind (a deployment with more distinct values than this for one
kind parses the others as before)."""

T = TypeVar("T")


class _Kept:
    """The most recently used values of one kind, by their JSON text (thread-safe: a tool
    worker's threads validate in parallel)."""

    def __init__(self, size: int) -> None:
        self._values: OrderedDict[bytes, Any] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, key: bytes) -> Any | None:
        with self._lock:
            value = self._values.get(key)
            if value is not None:
                self._values.move_to_end(key)
            return value

    def put(self, key: bytes, value: Any) -> None:
        with self._lock:
            self._values[key] = value
            while len(self._values) > self._size:
                self._values.popitem(last=False)


def SharedWhenIdentical(kept: int = SHARED_KEPT) -> WrapValidator:  # noqa: N802 - an annotation
    """The validator that shares the values of the field it annotates (each call has its own
    table of ``kept`` values)."""
    table = _Kept(kept)

    def share(value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
        if info.mode != "json" or info.context is not None or not isinstance(value, dict):
            return handler(value)
        try:
            key = orjson.dumps(value)
        except orjson.JSONEncodeError:  # an integer beyond 64 bits: validated, not shared
            return handler(value)
        if b"null" in key and orjson.loads(key) != value:
            # NaN and Infinity are written null: the key names another value. Read back, the
            # key equals ``value`` unless one was there (a float in it reads back as itself).
            return handler(value)
        found = table.get(key)
        if found is None:
            found = handler(value)
            if _same_under_every_override(found, key):
                table.put(key, found)
        return found

    return WrapValidator(share)


def _same_under_every_override(found: Any, key: bytes) -> bool:
    """Whether ``found`` is what any validation of the JSON ``key`` builds, whatever the
    caller's overrides (``strict``, ``extra``, ``by_alias``/``by_name``, which the validator
    cannot see): true when the strictest of them, strict and forbidding extra keys under the
    model's own aliases, accepts it. A value that only a lax parse accepts (a number given as a
    string, an unknown key ignored) is not kept: a later strict or forbidding parse of the same
    text must fail as it would have, not be answered with the lax one's instance."""
    if not isinstance(found, BaseModel):
        return False
    try:
        type(found).model_validate_json(key, strict=True, extra="forbid")
    except ValidationError:
        return False
    return True


def shared_default(model: Callable[[], T]) -> Callable[[], T]:
    """A default factory returning one ``model()`` built at its first use (``model`` a frozen
    model whose lists nothing changes in place)."""
    built: list[T] = []

    def default() -> T:
        if not built:
            built.append(model())
        return built[0]

    return default
